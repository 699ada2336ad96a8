"""route.wire: the messages built in code are cuzk's, byte for byte, and prove_header reads what it routes on."""

from __future__ import annotations

import importlib
import importlib.resources
import sys
from pathlib import Path

import pytest

from vastctl.route import wire

PROTO = Path(wire.__file__).with_name("proving.proto")

# ProveRequest{submit{request_id "r1", proof_kind POREP_SEAL_COMMIT, vanilla_proof 01 02, sector_number 7}}, by hand:
# 0a 0d (field 1, 13 bytes) | 0a 02 "r1" | 10 01 | 52 02 01 02 (field 10) | a0 01 07 (field 20: key 160 as a varint)
PROVE_VECTOR = bytes.fromhex("0a0d" "0a027231" "1001" "52020102" "a00107")
# ProveResponse{result{job_id "j", status FAILED, error_message "oom", total_ms 300}}
FAILED_VECTOR = bytes.fromhex("0a0d" "0a016a" "1002" "22036f6f6d" "70ac02")


def test_a_prove_request_is_the_bytes_cuzk_reads():
    built = wire.ProveRequest(submit=wire.SubmitProofRequest(request_id="r1", proof_kind=wire.POREP_SEAL_COMMIT,
                                                             vanilla_proof=b"\x01\x02", sector_number=7))
    assert built.SerializeToString() == PROVE_VECTOR
    assert wire.prove_header(PROVE_VECTOR) == wire.ProveHeader(request_id="r1", proof_kind=1)


def test_a_failed_proof_inside_grpc_ok_is_read_from_its_bytes():
    result = wire.ProveResponse.FromString(FAILED_VECTOR).result
    assert (result.job_id, result.status, result.error_message, result.total_ms) == ("j", wire.STATUS_FAILED, "oom", 300)


def test_prove_header_skips_the_proof_bytes_and_unknown_fields():
    big = wire.ProveRequest(submit=wire.SubmitProofRequest(
        request_id="big", proof_kind=wire.SNAP_DEALS_UPDATE, vanilla_proofs=[b"x" * 70_000, b"y" * 3],
        randomness=b"r" * 32, partition_index=3, comm_r_old=b"c")).SerializeToString()
    # a field this router does not know (99, fixed64 and fixed32 wire types) is skipped, not refused
    extra = bytes.fromhex("9906" "0807060504030201" "9d06" "01020304")
    assert wire.prove_header(big + extra) == wire.ProveHeader(request_id="big", proof_kind=2)
    assert wire.prove_header(b"") == wire.ProveHeader(request_id="", proof_kind=0)


@pytest.mark.parametrize("data", [b"\x0a\x10\x0a", b"\x0a", b"\x0b\x00", b"\xff" * 11],
                         ids=["runs-past", "truncated-length", "wire-type-3", "varint-too-long"])
def test_bytes_that_are_not_a_prove_request_are_malformed(data):
    with pytest.raises(wire.Malformed):
        wire.prove_header(data)


def test_the_messages_built_in_code_match_proving_proto_compiled_by_protoc(tmp_path):
    from grpc_tools import protoc

    include = importlib.resources.files("grpc_tools") / "_proto"
    assert protoc.main(["protoc", f"-I{PROTO.parent}", f"-I{include}", f"--python_out={tmp_path}", PROTO.name]) == 0
    sys.path.insert(0, str(tmp_path))
    try:
        compiled = importlib.import_module("proving_pb2")
    finally:
        sys.path.remove(str(tmp_path))
    names = [m.name for m in compiled.DESCRIPTOR.message_types_by_name.values()]
    assert sorted(names) == sorted(wire._MESSAGES)
    for name in names:
        theirs = compiled.DESCRIPTOR.message_types_by_name[name]
        ours = getattr(wire, name, None) or wire._message(name)
        assert [(f.name, f.number, f.type, f.is_repeated) for f in theirs.fields] == \
               [(f.name, f.number, f.type, f.is_repeated) for f in ours.DESCRIPTOR.fields], name
    assert compiled.ProveRequest.FromString(PROVE_VECTOR).submit.request_id == "r1"
    assert [m.name for m in compiled.DESCRIPTOR.services_by_name["ProvingEngine"].methods] == ["Prove", "GetStatus"]
    assert set(["Prove", "GetStatus"]) <= set(wire.METHODS)
