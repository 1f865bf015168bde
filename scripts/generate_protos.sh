#!/usr/bin/env bash
# Regenerate the controller gRPC modules from airflow_provider_pravega/protocol/controller.proto.
#
# Usage: scripts/generate_protos.sh [OUTPUT_ROOT]
#   OUTPUT_ROOT defaults to the repository root; the files land in
#   OUTPUT_ROOT/airflow_provider_pravega/protocol/controller_pb2{.py,.pyi,_grpc.py}.
#   PYTHON selects the interpreter (default: python3); it must have grpcio-tools==1.85.1, the
#   version the committed files were made with (tests/protocol/test_generated_protos.py checks
#   that regenerating gives identical files).
# protoc runs from the repository root with the proto path given relative to it, so the generated
# code imports `from airflow_provider_pravega.protocol import controller_pb2`.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$REPO_ROOT}"
PYTHON="${PYTHON:-python3}"
WANTED_TOOLS_VERSION="1.85.1"
PROTO="airflow_provider_pravega/protocol/controller.proto"

have="$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))' 2>/dev/null || true)"
if [[ "$have" != "$WANTED_TOOLS_VERSION" ]]; then
  echo "generate_protos.sh: need grpcio-tools==$WANTED_TOOLS_VERSION for $PYTHON, found '${have:-none}'." >&2
  echo "  install it with: $PYTHON -m pip install grpcio-tools==$WANTED_TOOLS_VERSION" >&2
  exit 2
fi

mkdir -p "$OUT"
cd "$REPO_ROOT"
"$PYTHON" -m grpc_tools.protoc \
  --proto_path=. \
  --python_out="$OUT" \
  --pyi_out="$OUT" \
  --grpc_python_out="$OUT" \
  "$PROTO"
echo "generated $OUT/${PROTO%.proto}_pb2.py, _pb2.pyi, _pb2_grpc.py"
