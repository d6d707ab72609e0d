"""The topology file read section by section: `base` (the shared readers), `settings`, `shards`, `regions`;
router_config/loader.py puts them together and checks across sections."""
