#!/usr/bin/env bash
# Idempotent set-up of everything squeal needs on a Debian machine:
#   1. Debian packages (MariaDB, memcached, libmemcached-tools, twemproxy, ZooKeeper, Prometheus) — only if missing
#   2. the Python venv in .venv with squeal installed (editable) and its pinned dependencies
#   3. the Rust router, built in release mode (router/target/release/squeal-router)
#   4. squeal's native binlog reader (squeal_native/, a PyO3 extension) built by setuptools-rust with (3)
#   5. memcached's own test suite (the Debian source package of the installed memcached, unpacked into
#      var/memcached-src/, gitignored) for tests/router/test_memcached_suite.py
# Safe to run again: each step checks what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server mariadb-client)
command -v memcached >/dev/null 2>&1 || need_apt+=(memcached)
command -v memcstat >/dev/null 2>&1 || need_apt+=(libmemcached-tools)
command -v nutcracker >/dev/null 2>&1 || [ -x /usr/sbin/nutcracker ] || need_apt+=(nutcracker)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
perl -MIO::Socket::SSL -e1 >/dev/null 2>&1 || need_apt+=(libio-socket-ssl-perl)  # memcached's t/ssl_*.t (SSL_TEST=1)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need_apt+=(prometheus)  # both in one package
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Debian starts the packaged services on install; squeal runs its own instances on free ports.
for svc in mariadb memcached zookeeper prometheus; do
  (command -v service >/dev/null 2>&1 && service "$svc" stop >/dev/null 2>&1) || true
done

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi

if [ -f router/Cargo.toml ]; then
  command -v cargo >/dev/null 2>&1 || { echo "setup: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
  echo "setup: building the router (cargo build --release)"
  (cd router && cargo build --release --locked -q)
fi

# The protocol model (model/, docs/model.md): only its pinned crates fetched here; `make test` builds it.
if [ -f model/Cargo.toml ]; then
  command -v cargo >/dev/null 2>&1 || { echo "setup: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
  (cd model && cargo fetch --locked -q)
fi

# squeal itself, editable, with its pinned dependencies and its native binlog reader (squeal_native/, Rust +
# PyO3, compiled by setuptools-rust as part of the install, docs/squeal.md): again only when pyproject.toml or
# the reader's sources change, or the reader does not import.
if [ -f squeal_native/Cargo.toml ]; then
  command -v cargo >/dev/null 2>&1 || { echo "setup: cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
fi
stamp=.venv/.squeal-installed
install_sum=$(cat pyproject.toml squeal_native/Cargo.toml squeal_native/Cargo.lock squeal_native/src/*.rs \
  | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$install_sum" ] || ! .venv/bin/python -c "from squeal import squeal_native" 2>/dev/null
then
  echo "setup: installing squeal (pinned dependencies, native reader: cargo build --release)"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
  echo "$install_sum" > "$stamp"
fi

# memcached's test suite (t/*.t of the source the installed package was built from; never copied into
# git): a deb-src entry for the Debian archives, then `apt-get source` of exactly the installed
# version into var/memcached-src/ (dpkg-dev unpacks it and applies Debian's patches). The suite needs
# only perl's core modules (Test::More, IO::Socket::INET).
mc_version=$(dpkg-query -W -f='${Version}' memcached 2>/dev/null || true)
mc_upstream=${mc_version%%-*}
if [ -n "$mc_version" ] && [ ! -f "var/memcached-src/memcached-$mc_upstream/t/lib/MemcachedTest.pm" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if ! command -v dpkg-source >/dev/null 2>&1 || ! command -v prove >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends dpkg-dev perl >/dev/null
  fi
  if ! apt-cache showsrc memcached 2>/dev/null | grep -qx "Version: $mc_version"; then
    codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
    echo "setup: adding deb-src entries for $codename (/etc/apt/sources.list.d/squeal-deb-src.sources)"
    printf '%s\n' \
      "# Added by squeal's scripts/setup.sh: source packages (memcached's test suite for the router tests)." \
      "Types: deb-src" "URIs: http://deb.debian.org/debian" "Suites: $codename $codename-updates" \
      "Components: main" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" "" \
      "Types: deb-src" "URIs: http://deb.debian.org/debian-security" "Suites: $codename-security" \
      "Components: main" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" \
      | $SUDO tee /etc/apt/sources.list.d/squeal-deb-src.sources >/dev/null
    $SUDO apt-get update -qq
  fi
  echo "setup: fetching memcached $mc_version source (its test suite) into var/memcached-src/"
  rm -rf var/memcached-src && mkdir -p var/memcached-src
  (cd var/memcached-src && apt-get source -qq "memcached=$mc_version" >/dev/null 2>&1)
  [ -f "var/memcached-src/memcached-$mc_upstream/t/lib/MemcachedTest.pm" ] || {
    echo "setup: apt-get source memcached=$mc_version did not unpack the test suite" >&2; exit 1; }
fi
echo "setup: done"
