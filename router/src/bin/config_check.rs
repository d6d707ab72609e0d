//! `squeal-router-config`: check an mcrouter-format config the way the router loads it, without
//! serving: run the preprocessor (macros, `@import`), build every route, print the warnings.
//! `--expand` prints the config after the preprocessor, as plain JSON. Exit 0 when it loads, 1 when
//! it does not (the reason on stderr), 2 for a bad command line.

use clap::Parser;
use squeal_router::{Context, Options, config, preprocess};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "squeal-router-config",
    version,
    about = "Check (or expand) a squeal-router / mcrouter config without serving it"
)]
struct Cli {
    /// The config file (mcrouter's JSON dialect)
    config_file: PathBuf,
    /// Routing prefix of the default tree of a `routes` config; also `%default-route%` for macros
    #[arg(short = 'R', long, value_name = "PREFIX")]
    route_prefix: Option<String>,
    /// More constants for macros, as mcrouter's `--config-params`: name:value,name:value
    #[arg(long, value_name = "PARAMS")]
    config_params: Option<String>,
    /// Print the config after the preprocessor instead of building it
    #[arg(long)]
    expand: bool,
}

// A runtime because building servers starts their (idle) connection tasks; nothing connects.
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = Cli::parse();
    let path = &cli.config_file;
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => fail(&format!("cannot read {}: {e}", path.display())),
    };
    let dir = path.parent();
    let params = match preprocess::parse_params(cli.config_params.as_deref().unwrap_or_default()) {
        Ok(p) => p,
        Err(e) => fail(&format!("--config-params: {e}")),
    };
    if cli.expand {
        match preprocess::expand_file(&text, cli.route_prefix.as_deref(), dir, &params) {
            Ok(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
            Err(e) => fail(&format!("{}: {e}", path.display())),
        }
        return;
    }
    let ctx = Context::new(Options::default(), None);
    match config::load_from(&ctx, &text, cli.route_prefix.as_deref(), dir, &params) {
        Ok(cfg) => {
            for w in &cfg.warnings {
                eprintln!("{}: warning: {w}", path.display());
            }
            println!(
                "{}: loads ({} pools; handles: {})",
                path.display(),
                cfg.pools,
                cfg.types_used.join(", ")
            );
        }
        Err(e) => fail(&format!("{}: {e}", path.display())),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("squeal-router-config: {msg}");
    std::process::exit(1)
}
