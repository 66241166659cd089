"""Builds what a user installs without Rust, for one target: the `idem-runtime` wheel (the
native module and the `idem` binary), its sdist, and the npm tarballs (`idem-runtime` and the
target's platform package with the `.node` module and the binary), into --out.

    python packaging/build.py [--target x86_64-unknown-linux-gnu] [--out dist]

Linux targets are built against glibc 2.17 (manylinux2014) with zig as the linker and C
compiler (`cargo zigbuild` for the binary and the Node module, `maturin --zig` for the wheel),
whatever glibc the build machine has; packaging/check.py then checks the floor, the sizes and
the wheel's tags. Other targets build with the host's toolchain, on a machine of that target
(macOS for the darwin ones, Windows for msvc). The tools are pinned in
packaging/requirements.txt; the build runs in the workspace's target directory
($CARGO_TARGET_DIR or target/), under the `dist` profile (release, stripped).

One version for everything: the workspace's (Cargo.toml `[workspace.package] version`), which
the wheel takes through maturin and the npm packages are stamped with here.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
PYTHON = REPO / "clients" / "python"
JS = REPO / "clients" / "js"
BUNDLED = PYTHON / "python" / "idem_runtime" / "_bin"

#: Rust target -> (npm platform id, package.json os, cpu, libc, whether it is built against
#: glibc 2.17 with zig). The ids are napi-rs's; platform.js names the same.
TARGETS = {
    "x86_64-unknown-linux-gnu": ("linux-x64-gnu", "linux", "x64", "glibc", True),
    "aarch64-unknown-linux-gnu": ("linux-arm64-gnu", "linux", "arm64", "glibc", True),
    "x86_64-apple-darwin": ("darwin-x64", "darwin", "x64", None, False),
    "aarch64-apple-darwin": ("darwin-arm64", "darwin", "arm64", None, False),
    "x86_64-pc-windows-msvc": ("win32-x64-msvc", "win32", "x64", None, False),
}
GLIBC_FLOOR = "2.17"
#: The license texts every artifact carries (the wheel and the sdist through pyproject's
#: license-files).
LICENSES = ("LICENSE-MIT", "LICENSE-APACHE")
PROFILE = "dist"


def version() -> str:
    return tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]


def target_dir() -> pathlib.Path:
    given = os.environ.get("CARGO_TARGET_DIR")
    return pathlib.Path(given) if given else REPO / "target"


def run(argv: list, cwd: pathlib.Path = REPO, env: dict | None = None) -> None:
    print("+", " ".join(str(a) for a in argv), flush=True)
    subprocess.run([str(a) for a in argv], cwd=cwd, env={**os.environ, **(env or {})}, check=True)


def build_rust(target: str, zig: bool) -> tuple[pathlib.Path, pathlib.Path]:
    """The `idem` binary and the Node module, in one cargo invocation (they share most crates)."""
    triple = f"{target}.{GLIBC_FLOOR}" if zig else target
    cargo = ["cargo", "zigbuild"] if zig else ["cargo", "build"]
    run([*cargo, "--locked", "--profile", PROFILE, "--target", triple, "-p", "idem-cli", "-p", "idem-node"])
    out = target_dir() / target / PROFILE
    exe = ".exe" if "windows" in target else ""
    node = {"windows": "idem_node.dll", "apple": "libidem_node.dylib"}
    lib = next((v for k, v in node.items() if k in target), "libidem_node.so")
    return out / f"idem{exe}", out / lib


def build_wheel(target: str, zig: bool, binary: pathlib.Path, out: pathlib.Path) -> None:
    """The wheel, with the binary beside the module (idem_runtime/_bin, where _cli.py runs it)."""
    BUNDLED.mkdir(exist_ok=True)
    bundled = BUNDLED / binary.name
    shutil.copy2(binary, bundled)
    try:
        argv = [sys.executable, "-m", "maturin", "build", "--locked", "--profile", PROFILE, "--target", target,
                "--manifest-path", PYTHON / "Cargo.toml", "--out", out]
        if zig:
            argv += ["--zig", "--compatibility", "manylinux2014"]
        run(argv, cwd=PYTHON)
    finally:
        shutil.rmtree(BUNDLED)


def build_sdist(out: pathlib.Path) -> None:
    run([sys.executable, "-m", "maturin", "sdist", "--manifest-path", PYTHON / "Cargo.toml", "--out", out], cwd=PYTHON)


def npm_pack(directory: pathlib.Path, out: pathlib.Path) -> None:
    run(["npm", "pack", "--silent", "--pack-destination", out], cwd=directory)


def build_npm(target: str, binary: pathlib.Path, module: pathlib.Path, out: pathlib.Path) -> None:
    """The platform package and `idem-runtime` itself, staged under out/npm and packed into out."""
    platform_id, os_name, cpu, libc, _ = TARGETS[target]
    ver = version()
    stage = out / "npm"
    shutil.rmtree(stage, ignore_errors=True)

    name = f"idem-runtime-{platform_id}"
    plat = stage / name
    (plat / "bin").mkdir(parents=True)
    shutil.copy2(module, plat / "idem_node.node")
    shutil.copy2(binary, plat / "bin" / binary.name)
    (plat / "bin" / binary.name).chmod(0o755)
    manifest = {
        "name": name,
        "version": ver,
        "description": f"The {platform_id} native parts of idem-runtime: the Node module and the idem binary",
        "license": "MIT OR Apache-2.0",
        "os": [os_name],
        "cpu": [cpu],
        **({"libc": [libc]} if libc else {}),
        "main": "idem_node.node",
        "files": ["idem_node.node", "bin/", *LICENSES],
        "engines": {"node": ">=20"},
        # bin/idem.mjs compares the installed file with it: one cut short or replaced is
        # reported as damaged instead of being handed to /bin/sh by execvp.
        "idemBinarySize": binary.stat().st_size,
    }
    (plat / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    licenses(plat)
    (plat / "README.md").write_text(f"# {name}\n\nThe prebuilt native module and `idem` binary of "
                                    f"[idem-runtime](https://www.npmjs.com/package/idem-runtime) for {platform_id}. "
                                    "Installed by idem-runtime as an optional dependency; not used on its own.\n")
    npm_pack(plat, out)

    main = stage / "idem-runtime"
    package = json.loads((JS / "package.json").read_text())
    files = package["files"]
    for pattern in files:
        for src in JS.glob(pattern):
            if src.name.endswith(".test.mjs"):
                continue
            dest = main / src.relative_to(JS)
            if src.is_dir():
                shutil.copytree(src, dest, dirs_exist_ok=True)
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
    # No install script: nothing is built on the user's machine (npm would not run one
    # unasked anyway). Every platform package is listed; npm installs the one that fits.
    package["scripts"] = {k: v for k, v in package.get("scripts", {}).items() if k not in ("install", "test", "bench", "typecheck")}
    package.pop("devDependencies", None)
    package["version"] = ver
    package["optionalDependencies"] = {f"idem-runtime-{t[0]}": ver for t in TARGETS.values() if t[0] in built_platforms(out, platform_id)}
    package["files"] = [f for f in files if f not in ("src/", "build.rs", "Cargo.toml", "scripts/")] + ["README.md", *LICENSES]
    (main / "package.json").write_text(json.dumps(package, indent=2) + "\n")
    shutil.copy2(REPO / "packaging" / "npm-README.md", main / "README.md")
    licenses(main)
    npm_pack(main, out)


def licenses(directory: pathlib.Path) -> None:
    """The license texts, copied beside a package (its `files` name them: npm packs a file
    named LICENSE on its own, not LICENSE-MIT)."""
    for name in LICENSES:
        shutil.copy2(REPO / name, directory / name)


def built_platforms(out: pathlib.Path, this: str) -> set:
    """The platform packages that exist in `out` (from earlier runs for other targets) and this one."""
    found = {this}
    for t in TARGETS.values():
        if list(out.glob(f"idem-runtime-{t[0]}-*.tgz")):
            found.add(t[0])
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="x86_64-unknown-linux-gnu", choices=sorted(TARGETS))
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "dist")
    ap.add_argument("--skip", action="append", default=[], choices=["wheel", "sdist", "npm"],
                    help="leave out an artifact")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    zig = TARGETS[args.target][4]
    binary, module = build_rust(args.target, zig)
    if "wheel" not in args.skip:
        build_wheel(args.target, zig, binary, out)
    if "sdist" not in args.skip:
        build_sdist(out)
    if "npm" not in args.skip:
        build_npm(args.target, binary, module, out)
    print(f"built into {out}:")
    for f in sorted(out.iterdir()):
        if f.is_file():
            print(f"  {f.name}  {f.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
