"""The package's PEP 517 build backend: maturin's, behind one check.

pip falls back to the sdist where no wheel fits the machine, and maturin would then, finding no
cargo, ask for puccinialin to download a Rust toolchain, and fail in whatever way the network
or the compiler does. This says instead, at pip's first question to the backend and before
anything is downloaded or compiled, which wheels exist and what a source build needs.
"""

from __future__ import annotations

import platform
import shutil
import sys

from maturin import *  # noqa: F401,F403  (every hook maturin defines)
from maturin import build_editable as _build_editable
from maturin import get_requires_for_build_editable as _get_requires_for_build_editable
from maturin import get_requires_for_build_wheel as _get_requires_for_build_wheel
from maturin import build_wheel as _build_wheel
from maturin import prepare_metadata_for_build_wheel as _prepare_metadata_for_build_wheel

#: The wheels built for each release (packaging/README.md); any other machine builds from source.
WHEELS = "Linux x86_64 with glibc >= 2.17 (manylinux2014), CPython >= 3.9"


def _wheel_fits() -> bool:
    """Whether this machine is one the prebuilt wheels cover (then pip chose the sdist itself)."""
    libc, version = platform.libc_ver()
    glibc = tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) if libc == "glibc" else ()
    return (
        platform.system() == "Linux"
        and platform.machine() in ("x86_64", "AMD64")
        and platform.python_implementation() == "CPython"
        and sys.version_info >= (3, 9)
        and glibc >= (2, 17)
    )


def _need_cargo() -> None:
    if shutil.which("cargo"):
        return
    here = (
        f"{platform.system()} {platform.machine()}, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )
    why = (
        f"pip is building it from source (the sdist), though the prebuilt wheel fits this machine ({here}): "
        "it was asked not to use wheels (--no-binary), or the index it reads has no wheel of this version. "
        "Install the wheel instead (pip install --only-binary idem-runtime idem-runtime)"
        if _wheel_fits()
        else f"no prebuilt wheel fits this machine ({here}); wheels exist for {WHEELS}"
    )
    sys.stderr.write(
        f"\nidem-runtime: {why}.\n"
        "Building it from source needs Rust's cargo on PATH (https://rustup.rs), then the same pip "
        "command again; the build takes a few minutes. A source build has the library but not the "
        "`idem` binary: cargo install --locked --path crates/idem-cli from a checkout of the "
        "repository, then IDEM_BINARY=/path/to/idem.\n\n"
    )
    sys.exit(1)


def get_requires_for_build_wheel(config_settings=None):  # noqa: D103
    _need_cargo()
    return _get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):  # noqa: D103
    _need_cargo()
    return _get_requires_for_build_editable(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):  # noqa: D103
    _need_cargo()
    return _build_wheel(wheel_directory, config_settings, metadata_directory)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):  # noqa: D103
    _need_cargo()
    return _prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):  # noqa: D103
    _need_cargo()
    return _build_editable(wheel_directory, config_settings, metadata_directory)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel
