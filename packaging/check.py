"""Checks what packaging/build.py built, as a user's machine would meet it: every ELF file in
the wheel and the npm tarballs needs no glibc symbol version above the floor (2.17), links no
library a manylinux system does not have (`auditwheel show` on the wheel), the wheel's tags are
abi3 and manylinux2014, the binary is stripped and within its size budget, and everything has
the workspace's version. Prints one table (sizes, floors found); exits 1 on any failure.

    python packaging/check.py [dist]

Needs binutils' readelf, and auditwheel (packaging/requirements.txt).
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]
GLIBC_FLOOR = (2, 17)
#: The `idem` binary, stripped; the issue that set it: 30.
BINARY_BUDGET = 25_000_000
#: The wheel and each npm tarball, compressed.
ARCHIVE_BUDGET = 25_000_000
#: The license texts every artifact carries.
LICENSES = ("LICENSE-MIT", "LICENSE-APACHE")


def version() -> str:
    return tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]


def glibc_needed(data: bytes) -> tuple:
    """The highest GLIBC_x.y symbol version an ELF file needs, and whether it has a symbol table."""
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        versions = subprocess.run(["readelf", "--version-info", "--wide", f.name], capture_output=True, text=True, check=True).stdout
        sections = subprocess.run(["readelf", "--sections", "--wide", f.name], capture_output=True, text=True, check=True).stdout
    found = {tuple(int(p) for p in m.split(".")) for m in re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", versions)}
    return (max(found) if found else None), ".symtab" in sections


def is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


def main() -> int:
    dist = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "dist").resolve()
    ver = version()
    failures = []
    rows = []

    def check_elf(archive: str, name: str, data: bytes) -> None:
        floor, symtab = glibc_needed(data)
        shown = ".".join(map(str, floor)) if floor else "none"
        rows.append((archive, name, len(data), f"GLIBC_{shown}", "stripped" if not symtab else "NOT stripped"))
        if floor and floor > GLIBC_FLOOR:
            failures.append(f"{archive}:{name} needs GLIBC_{shown}, above the floor {'.'.join(map(str, GLIBC_FLOOR))}")
        if symtab:
            failures.append(f"{archive}:{name} is not stripped")
        if name.endswith("/idem") and len(data) > BINARY_BUDGET:
            failures.append(f"{archive}:{name} is {len(data)} bytes, over the budget of {BINARY_BUDGET}")

    def check_archive(path: pathlib.Path, versioned: bool) -> None:
        """Its row, its version (in the name) and, for what a user downloads, its size."""
        rows.append((path.name, "(archive)", path.stat().st_size, "", ""))
        if not versioned:
            failures.append(f"{path.name} is not version {ver}")
        if path.stat().st_size > ARCHIVE_BUDGET:
            failures.append(f"{path.name} is over {ARCHIVE_BUDGET} bytes")

    def check_licenses(archive: str, names: list, where: str) -> None:
        for lic in LICENSES:
            if not any(n.endswith(f"{where}{lic}") for n in names):
                failures.append(f"{archive} lacks {lic} ({where}{lic})")

    wheels = sorted(dist.glob("idem_runtime-*.whl"))
    tarballs = sorted(dist.glob("idem-runtime-*.tgz"))
    sdists = sorted(dist.glob("idem_runtime-*.tar.gz"))
    if not wheels or not tarballs or not sdists:
        failures.append(f"missing artifacts in {dist}: wheels {len(wheels)}, npm tarballs {len(tarballs)}, sdists {len(sdists)}")
    for wheel in wheels:
        check_archive(wheel, wheel.name.startswith(f"idem_runtime-{ver}-"))
        if "-cp39-abi3-" not in wheel.name:
            failures.append(f"{wheel.name} is not abi3 for CPython >= 3.9")
        linux = "linux" in wheel.name
        if linux and ("manylinux_2_17" not in wheel.name or "manylinux2014" not in wheel.name):
            failures.append(f"{wheel.name} is a Linux wheel not tagged manylinux2014 / manylinux_2_17")
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            check_licenses(wheel.name, names, ".dist-info/licenses/")
            if "idem_runtime/_bin/idem" not in names and "idem_runtime/_bin/idem.exe" not in names:
                failures.append(f"{wheel.name} has no idem binary in idem_runtime/_bin")
            for n in names:
                data = z.read(n)
                if is_elf(data):
                    check_elf(wheel.name, n, data)
        if linux:
            shown = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True)
            text = " ".join(shown.stdout.split())
            print(f"auditwheel show {wheel.name}:\n  {text}\n")
            if shown.returncode != 0 or 'is consistent with the following platform tag: "manylinux_2_17_x86_64"' not in text:
                if "aarch64" not in wheel.name:
                    failures.append(f"auditwheel does not find {wheel.name} consistent with manylinux_2_17_x86_64")
    for sdist in sdists:
        check_archive(sdist, sdist.name == f"idem_runtime-{ver}.tar.gz")
        with tarfile.open(sdist) as t:
            names = t.getnames()
        check_licenses(sdist.name, names, f"idem_runtime-{ver}/")
        if not any(n.endswith("build_backend/idem_build_backend.py") for n in names):
            failures.append(f"{sdist.name} lacks the build backend wrapper")
    for tgz in tarballs:
        check_archive(tgz, tgz.name.endswith(f"-{ver}.tgz"))
        with tarfile.open(tgz) as t:
            names = t.getnames()
            check_licenses(tgz.name, names, "package/")
            manifest = json.loads(t.extractfile("package/package.json").read())
            if manifest.get("version") != ver:
                failures.append(f"{tgz.name}: package.json says version {manifest.get('version')}, not {ver}")
            if manifest["name"] == "idem-runtime":
                optional = manifest.get("optionalDependencies") or {}
                if not optional or any(v != ver for v in optional.values()):
                    failures.append(f"{tgz.name}: optionalDependencies {optional} do not name platform packages at {ver}")
                if "scripts" in manifest and "install" in manifest["scripts"]:
                    failures.append(f"{tgz.name} has an install script: nothing may build on a user's machine")
            else:
                exe = "package/bin/idem.exe" if "win32" in manifest["name"] else "package/bin/idem"
                for needed in (exe, "package/idem_node.node"):
                    if needed not in names:
                        failures.append(f"{tgz.name} lacks {needed}")
                if exe in names and manifest.get("idemBinarySize") != t.getmember(exe).size:
                    failures.append(f"{tgz.name}: idemBinarySize {manifest.get('idemBinarySize')} is not the binary's {t.getmember(exe).size} bytes")
            for m in t.getmembers():
                if not m.isfile():
                    continue
                data = t.extractfile(m).read()
                if is_elf(data):
                    check_elf(tgz.name, m.name, data)
                    if m.name.endswith("/bin/idem") and not m.mode & 0o100:
                        failures.append(f"{tgz.name}:{m.name} is not executable in the tarball")

    print("| artifact | file | bytes | highest glibc symbol | |")
    print("|---|---|---:|---|---|")
    for archive, name, size, floor, note in rows:
        print(f"| {archive} | {name} | {size:,} | {floor} | {note} |")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
