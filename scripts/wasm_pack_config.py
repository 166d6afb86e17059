#!/usr/bin/env python3
"""Print wasm-pack.toml as shell assignments for the build and test scripts.

Usage: eval "$(python3 scripts/wasm_pack_config.py [--variant NAME])"
Every key becomes WP_<SECTION>_<KEY>; lists become space-separated strings.
Unknown or missing keys are an error, so a typo cannot silently change the build.

build.features ("default", or a list of the crate's cargo features) also
becomes WP_BUILD_FEATURE_FLAGS, the cargo arguments that select it: none for
"default", else --no-default-features and --features with the list.

--variant NAME applies [variant.NAME] over [build] (any key of [build] may
be changed there) and sets WP_VARIANT=NAME (else it is empty). Every
variant is checked, whichever is asked for.
"""
import os
import re
import shlex
import sys
import tomllib

REQUIRED = {
    "build": ["target", "profile", "out_dir", "out_name", "features", "wasm_opt", "wasm_opt_flags"],
    "test": ["browsers", "headless", "chromedriver", "geckodriver"],
}


def check_build(build, where, cargo_features):
    """A [build] table (or one with a variant applied): None, or what is wrong."""
    if build["wasm_opt"] not in ("binaryen-npm", "off"):
        return f"{where}.wasm_opt must be 'binaryen-npm' or 'off'"
    features = build["features"]
    if features == "default":
        return None
    if not isinstance(features, list):
        return f"{where}.features must be \"default\" or a list of the crate's cargo features"
    for feature in features:
        if feature == "default":
            return f'{where}.features: for the default features write features = "default", not a list'
        if not isinstance(feature, str) or feature not in cargo_features:
            known = ", ".join(sorted(f for f in cargo_features if f != "default")) or "none"
            return f"{where}.features: {feature!r} is no cargo feature of the crate (known: {known})"
    return None


def feature_flags(features):
    if features == "default":
        return ""
    flags = ["--no-default-features"]
    if features:
        flags += ["--features", ",".join(features)]
    return " ".join(flags)


def main() -> int:
    args = sys.argv[1:]
    variant = None
    if args[:1] == ["--variant"] and len(args) == 2 and args[1]:
        variant = args[1]
    elif args:
        print("usage: wasm_pack_config.py [--variant NAME]", file=sys.stderr)
        return 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "wasm-pack.toml"), "rb") as f:
        config = tomllib.load(f)
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        cargo_features = tomllib.load(f).get("features", {})
    for section in config:
        if section not in REQUIRED and section != "variant":
            print(f"wasm-pack.toml: unknown section [{section}]", file=sys.stderr)
            return 1
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
    problem = check_build(config["build"], "build", cargo_features)
    if problem:
        print(f"wasm-pack.toml: {problem}", file=sys.stderr)
        return 1
    variants = config.get("variant", {})
    for name, table in variants.items():
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) or not isinstance(table, dict):
            print(f"wasm-pack.toml: [variant.{name}] must be a table named with a-z 0-9 -", file=sys.stderr)
            return 1
        for key in table:
            if key not in REQUIRED["build"]:
                print(f"wasm-pack.toml: unknown key variant.{name}.{key} (a variant changes keys of [build])", file=sys.stderr)
                return 1
        problem = check_build({**config["build"], **table}, f"variant.{name}", cargo_features)
        if problem:
            print(f"wasm-pack.toml: {problem}", file=sys.stderr)
            return 1
    if variant is not None:
        if variant not in variants:
            known = ", ".join(variants) or "none"
            print(f"wasm-pack.toml: no [variant.{variant}] (known: {known})", file=sys.stderr)
            return 1
        config["build"] = {**config["build"], **variants[variant]}
    for section, keys in REQUIRED.items():
        for key in keys:
            value = config[section][key]
            if isinstance(value, list):
                value = " ".join(str(v) for v in value)
            elif isinstance(value, bool):
                value = "true" if value else "false"
            value = os.path.expanduser(str(value))
            print(f"WP_{section.upper()}_{key.upper()}={shlex.quote(value)}")
    print(f"WP_BUILD_FEATURE_FLAGS={shlex.quote(feature_flags(config['build']['features']))}")
    print(f"WP_VARIANT={shlex.quote(variant or '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
