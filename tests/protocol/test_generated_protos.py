"""The committed controller gRPC modules are exactly what scripts/generate_protos.sh makes, and the
schema carries Pravega's wire contract (package, method names, field numbers, enum values)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_pravega.protocol import controller_pb2 as pb

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_DIR = REPO_ROOT / "airflow_provider_pravega" / "protocol"
GENERATED = ("controller_pb2.py", "controller_pb2.pyi", "controller_pb2_grpc.py")
PACKAGE = "io.pravega.controller.stream.api.grpc.v1"


def _grpc_tools_version() -> str | None:
    try:
        return importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.skipif(
    _grpc_tools_version() != "1.85.1",
    reason=f"regenerating needs grpcio-tools==1.85.1 (the dev extra); found {_grpc_tools_version()!r}",
)
def test_regenerating_gives_identical_files(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(REPO_ROOT / "scripts" / "generate_protos.sh"), str(tmp_path)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for name in GENERATED:
        fresh = (tmp_path / "airflow_provider_pravega" / "protocol" / name).read_bytes()
        committed = (PROTOCOL_DIR / name).read_bytes()
        assert fresh == committed, f"{name} is stale: run scripts/generate_protos.sh and commit the result"


def test_generator_refuses_other_tools_version(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 0.0.0\n")
    fake.chmod(0o755)
    proc = subprocess.run(
        [str(REPO_ROOT / "scripts" / "generate_protos.sh"), str(tmp_path / "out")],
        env={**os.environ, "PYTHON": str(fake)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "grpcio-tools==1.85.1" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_service_methods_and_paths() -> None:
    service = pb.DESCRIPTOR.services_by_name["ControllerService"]
    assert service.full_name == f"{PACKAGE}.ControllerService"
    expected = {
        # what the official client calls (notes §5.3) ...
        "createScope",
        "deleteScope",
        "listScopes",
        "listStreamsInScope",
        "createStream",
        "updateStream",
        "getStreamConfiguration",
        "sealStream",
        "deleteStream",
        "truncateStream",
        "getCurrentSegments",
        "getSegments",
        "getEpochSegments",
        "getSegmentsImmediatelyFollowing",
        "getURI",
        "createTransaction",
        "commitTransaction",
        "abortTransaction",
        "checkTransactionState",
        "pingTransaction",
        "scale",
        "checkScale",
        "getDelegationToken",
        # ... and what our own client needs
        "getSegmentsBetween",
        "isSegmentValid",
        "isStreamCutValid",
        "checkScopeExists",
        "checkStreamExists",
        "getControllerServerList",
        "listStreamsInScopeForTag",
    }
    assert {m.name for m in service.methods} == expected
    io = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert io["createTransaction"] == ("CreateTxnRequest", "CreateTxnResponse")
    assert io["commitTransaction"] == ("TxnRequest", "TxnStatus")
    assert io["checkTransactionState"] == ("TxnRequest", "TxnState")
    assert io["truncateStream"] == ("StreamCut", "UpdateStreamStatus")
    assert io["getSegmentsBetween"] == ("StreamCutRange", "StreamCutRangeResponse")


# message -> {field name: (number, type)} for the messages whose layout the client depends on (notes §5.4)
_T = {"string": 9, "int64": 3, "int32": 5, "double": 1, "bool": 8, "enum": 14, "message": 11}
FIELDS = {
    "StreamInfo": {"scope": (1, "string"), "stream": (2, "string"), "accessOperation": (3, "enum")},
    "SegmentId": {"streamInfo": (1, "message"), "segmentId": (2, "int64")},
    "SegmentRange": {"segmentId": (1, "message"), "minKey": (2, "double"), "maxKey": (3, "double")},
    "TxnId": {"highBits": (1, "int64"), "lowBits": (2, "int64")},
    "StreamConfig": {
        "streamInfo": (1, "message"),
        "scalingPolicy": (2, "message"),
        "retentionPolicy": (3, "message"),
        "tags": (4, "message"),
    },
    "ScalingPolicy": {
        "scaleType": (1, "enum"),
        "targetRate": (2, "int32"),
        "scaleFactor": (3, "int32"),
        "minNumSegments": (4, "int32"),
    },
    "RetentionPolicy": {"retentionType": (1, "enum"), "retentionParam": (2, "int64"), "retentionMax": (3, "int64")},
    "CreateTxnRequest": {"streamInfo": (1, "message"), "lease": (2, "int64")},
    "CreateTxnResponse": {"txnId": (1, "message"), "activeSegments": (2, "message"), "delegationToken": (3, "string")},
    "TxnRequest": {
        "streamInfo": (1, "message"),
        "txnId": (2, "message"),
        "writerId": (3, "string"),
        "timestamp": (4, "int64"),
    },
    "PingTxnRequest": {"streamInfo": (1, "message"), "txnId": (2, "message"), "lease": (3, "int64")},
    "ScaleRequest": {
        "streamInfo": (1, "message"),
        "sealedSegments": (2, "int64"),
        "newKeyRanges": (3, "message"),
        "scaleTimestamp": (4, "int64"),
    },
    "ScaleResponse": {"status": (1, "enum"), "segments": (2, "message"), "epoch": (3, "int32")},
    "ScopesResponse": {"scopes": (1, "string"), "continuationToken": (2, "message")},
    "StreamsInScopeResponse": {"streams": (1, "message"), "continuationToken": (2, "message"), "status": (3, "enum")},
    "GetSegmentsRequest": {"streamInfo": (1, "message"), "timestamp": (2, "int64")},
    "GetEpochSegmentsRequest": {"streamInfo": (1, "message"), "epoch": (2, "int32")},
    "NodeUri": {"endpoint": (1, "string"), "port": (2, "int32")},
}


@pytest.mark.parametrize("message", sorted(FIELDS))
def test_field_numbers_and_types(message: str) -> None:
    desc = pb.DESCRIPTOR.message_types_by_name[message]
    got = {f.name: (f.number, f.type) for f in desc.fields}
    assert got == {name: (num, _T[kind]) for name, (num, kind) in FIELDS[message].items()}


def test_maps_and_nested_messages() -> None:
    cut = pb.StreamCut(cut={5: 7})
    assert pb.StreamCut.DESCRIPTOR.fields_by_name["cut"].number == 2
    assert pb.StreamCut.FromString(cut.SerializeToString()).cut == {5: 7}
    rng = pb.StreamCutRange.DESCRIPTOR.fields_by_name
    assert (rng["from"].number, rng["to"].number) == (2, 3)
    assert [f.number for f in pb.SegmentsAtTime.SegmentLocation.DESCRIPTOR.fields] == [1, 2]
    assert [f.number for f in pb.SuccessorResponse.SegmentEntry.DESCRIPTOR.fields] == [1, 2]
    assert [f.number for f in pb.ScaleRequest.KeyRangeEntry.DESCRIPTOR.fields] == [1, 2]


def test_enum_values() -> None:
    assert dict(pb.TxnState.State.items()) == {
        "UNKNOWN": 0,
        "OPEN": 1,
        "COMMITTING": 2,
        "COMMITTED": 3,
        "ABORTING": 4,
        "ABORTED": 5,
    }
    assert dict(pb.PingTxnStatus.Status.items()) == {
        "OK": 0,
        "LEASE_TOO_LARGE": 1,
        "MAX_EXECUTION_TIME_EXCEEDED": 2,
        "SCALE_GRACE_TIME_EXCEEDED": 3,
        "DISCONNECTED": 4,
        "COMMITTED": 5,
        "ABORTED": 6,
        "UNKNOWN": 7,
    }
    assert dict(pb.TxnStatus.Status.items()) == {
        "SUCCESS": 0,
        "FAILURE": 1,
        "STREAM_NOT_FOUND": 2,
        "TRANSACTION_NOT_FOUND": 3,
    }
    assert dict(pb.CreateStreamStatus.Status.items()) == {
        "SUCCESS": 0,
        "FAILURE": 1,
        "STREAM_EXISTS": 2,
        "SCOPE_NOT_FOUND": 3,
        "INVALID_STREAM_NAME": 4,
    }
    assert dict(pb.ScaleStatusResponse.ScaleStatus.items()) == {
        "IN_PROGRESS": 0,
        "SUCCESS": 1,
        "INVALID_INPUT": 2,
        "INTERNAL_ERROR": 3,
    }
    assert dict(pb.ScalingPolicy.ScalingPolicyType.items()) == {
        "FIXED_NUM_SEGMENTS": 0,
        "BY_RATE_IN_KBYTES_PER_SEC": 1,
        "BY_RATE_IN_EVENTS_PER_SEC": 2,
    }


def test_txn_id_bytes_on_the_wire() -> None:
    """TxnId{highBits=1<<32, lowBits=5}: field 1 varint 0x100000000, field 2 varint 5."""
    assert pb.TxnId(highBits=1 << 32, lowBits=5).SerializeToString() == b"\x08\x80\x80\x80\x80\x10\x10\x05"
