#!/usr/bin/env python3
"""Generate the checked-in protobuf/gRPC modules from protos/v1/*.proto.

    python scripts/gen_protos.py          # regenerate into protos/v1/
    python scripts/gen_protos.py --check  # exit 1 if regenerating would change any checked-in file

The .proto files are staged under garrison/protos/v1/ in a temporary include root so that the generated
imports read `from garrison.protos.v1 import ...`, the name they are installed under.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # grpcio-tools, pinned with protobuf in pyproject.toml

REPO = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO / "protos" / "v1"
PACKAGE_PATH = Path("garrison") / "protos" / "v1"
BIN = Path(sys.executable).parent  # mypy-protobuf's plugins sit beside the interpreter
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Generate every module for protos/v1/*.proto into out_dir; return the generated files."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        staged = root / PACKAGE_PATH
        staged.mkdir(parents=True)
        protos = sorted(PROTO_DIR.glob("*.proto"))
        for proto in protos:
            shutil.copy(proto, staged / proto.name)
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{Path(protoc.__file__).parent / '_proto'}",
            f"--plugin=protoc-gen-mypy={BIN / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={BIN / 'protoc-gen-mypy_grpc'}",
            f"--python_out={root}",
            f"--grpc_python_out={root}",
            f"--mypy_out={root}",
            f"--mypy_grpc_out={root}",
            *[str(PACKAGE_PATH / p.name) for p in protos],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for path in sorted(staged.iterdir()):
            if path.name.endswith(GENERATED_SUFFIXES):
                target = out_dir / path.name
                shutil.copy(path, target)
                written.append(target)
        return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the checked-in files are stale")
    args = parser.parse_args()
    if not args.check:
        for path in generate(PROTO_DIR):
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [p.name for p in fresh if not filecmp.cmp(p, PROTO_DIR / p.name, shallow=False)
                 if (PROTO_DIR / p.name).exists()]
        missing = [p.name for p in fresh if not (PROTO_DIR / p.name).exists()]
    if stale or missing:
        print(f"generated protobuf code is out of date: {', '.join(stale + missing)}; "
              "run python scripts/gen_protos.py", file=sys.stderr)
        return 1
    print("generated protobuf code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
