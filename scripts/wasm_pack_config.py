#!/usr/bin/env python3
"""Print wasm-pack.toml as shell assignments for the build and test scripts.

Usage: eval "$(python3 scripts/wasm_pack_config.py)"
Every key becomes WP_<SECTION>_<KEY>; lists become space-separated strings.
Unknown or missing keys are an error, so a typo cannot silently change the build.
"""
import os
import shlex
import sys
import tomllib

REQUIRED = {
    "build": ["target", "profile", "out_dir", "out_name", "wasm_opt", "wasm_opt_flags"],
    "test": ["browsers", "headless", "chromedriver", "geckodriver"],
}

def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "wasm-pack.toml")
    with open(path, "rb") as f:
        config = tomllib.load(f)
    for section, keys in REQUIRED.items():
        table = config.get(section)
        if not isinstance(table, dict):
            print(f"wasm-pack.toml: missing [{section}]", file=sys.stderr)
            return 1
        for key in table:
            if key not in keys:
                print(f"wasm-pack.toml: unknown key {section}.{key}", file=sys.stderr)
                return 1
        for key in keys:
            if key not in table:
                print(f"wasm-pack.toml: missing {section}.{key}", file=sys.stderr)
                return 1
            value = table[key]
            if isinstance(value, list):
                value = " ".join(str(v) for v in value)
            elif isinstance(value, bool):
                value = "true" if value else "false"
            value = os.path.expanduser(str(value))
            print(f"WP_{section.upper()}_{key.upper()}={shlex.quote(value)}")
    if config["build"]["wasm_opt"] not in ("binaryen-npm", "off"):
        print("wasm-pack.toml: build.wasm_opt must be 'binaryen-npm' or 'off'", file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
