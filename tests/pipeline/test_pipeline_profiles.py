"""The measured block-profile and cluster file formats (docs/pipeline.md, "Measured
profiles"): what loads, and the typed error every malformed input gets at the boundary."""

from __future__ import annotations

import copy
import json

import pytest

from av_infer.errors import InvalidParameterError
from av_infer.pipeline.cluster import (
    cluster_from_profiles,
    load_cluster_file,
    parse_cluster_doc,
    resolve_cluster,
)
from av_infer.pipeline.errors import (
    MissingCellError,
    NonMonotoneProfileError,
    ProfileFormatError,
    ProfileUnitsError,
    UnknownDeviceTypeError,
)
from av_infer.pipeline.profile_files import (
    load_profiles,
    parse_profile,
    require_types,
)

GOOD = {
    "format": "av_infer.block_profile", "version": 1, "model": "m", "device_type": "gpu-x",
    "source": "measured", "latency_unit": "ms", "bytes_unit": "KiB", "n_blocks": 3,
    "cut_bytes": [2, 1],
    "fractions": {"1": {"batches": [1, 2, 4], "latency": [[1, 2, 3], [1.5, 2.5, 3.5],
                                                          [2, 3, 4]]},
                  "2": {"batches": [1], "latency": [[1.8, 3, 5]]}},
    "provenance": {"command": "test"},
}


def _bad(**change):
    doc = copy.deepcopy(GOOD)
    for k, v in change.items():
        doc[k] = v
    return doc


def test_a_good_profile_converts_units_and_keeps_per_fraction_batches():
    p = parse_profile(GOOD)
    assert p.device_type == "gpu-x" and p.n_blocks == 3 and p.source == "measured"
    assert p.latency(1, 2) == [1500.0, 2500.0, 3500.0]  # ms -> us
    assert p.cut_bytes == (2048.0, 1024.0) and p.out_bytes == [2048.0, 1024.0, 0.0]
    assert p.batches_at(1) == [1, 2, 4] and p.batches_at(2) == [1] and p.batches_at(3) == []
    assert p.vfracs == [1, 2] and p.batches == [1, 2, 4]
    with pytest.raises(KeyError):
        p.latency(2, 4)  # not measured: no value, no sentinel


@pytest.mark.parametrize("cell, err", [
    (None, MissingCellError), (float("inf"), ProfileFormatError),
    (float("nan"), ProfileFormatError), (-1.0, ProfileFormatError),
    (0.0, ProfileFormatError), ("3", ProfileFormatError)])
def test_bad_cells_are_refused(cell, err):
    doc = copy.deepcopy(GOOD)
    doc["fractions"]["1"]["latency"][1][2] = cell
    with pytest.raises(err):
        parse_profile(doc)


def test_missing_cells_and_rows():
    doc = copy.deepcopy(GOOD)
    doc["fractions"]["1"]["latency"][0] = [1, 2]  # a block short
    with pytest.raises(MissingCellError, match="3 block latencies"):
        parse_profile(doc)
    doc = copy.deepcopy(GOOD)
    doc["fractions"]["1"]["latency"].pop()  # a batch without its row
    with pytest.raises(MissingCellError):
        parse_profile(doc)
    with pytest.raises(MissingCellError, match="cut_bytes"):
        parse_profile(_bad(cut_bytes=[1]))
    with pytest.raises(MissingCellError):
        parse_profile(_bad(fractions={}))


def test_non_monotone_data_is_refused():
    doc = copy.deepcopy(GOOD)
    doc["fractions"]["1"]["latency"][2] = [2, 3, 2]  # block 2: 3.5 ms at b=2, 2 at b=4
    with pytest.raises(NonMonotoneProfileError, match="block 2"):
        parse_profile(doc)
    doc = copy.deepcopy(GOOD)
    doc["fractions"]["1"]["batches"] = [1, 4, 2]
    with pytest.raises(NonMonotoneProfileError, match="increasing"):
        parse_profile(doc)
    doc = copy.deepcopy(GOOD)
    doc["fractions"]["1"]["latency"][1] = [0.95, 2, 3]  # 5 % faster: timing noise, kept
    assert parse_profile(doc).latency(1, 2)[0] == pytest.approx(950.0)


def test_bad_units_and_formats():
    with pytest.raises(ProfileUnitsError):
        parse_profile(_bad(latency_unit="cycles"))
    with pytest.raises(ProfileUnitsError):
        parse_profile(_bad(bytes_unit="bits"))
    with pytest.raises(ProfileFormatError):
        parse_profile(_bad(format="something"))
    with pytest.raises(ProfileFormatError):
        parse_profile(_bad(version=7))
    with pytest.raises(ProfileFormatError):
        parse_profile(_bad(source="guessed"))
    doc = copy.deepcopy(GOOD)
    doc["fractions"]["half"] = doc["fractions"].pop("2")
    with pytest.raises(ProfileFormatError, match="fraction key"):
        parse_profile(doc)
    # every profile error is an InvalidParameterError with a stable code
    try:
        parse_profile(_bad(latency_unit="cycles"))
    except InvalidParameterError as e:
        assert e.code == "bad_profile"


def _write(d, doc, name=None):
    d.mkdir(exist_ok=True)
    (d / (name or f"{doc['model']}.{doc['device_type']}.blocks.json")).write_text(
        json.dumps(doc))


def test_directory_round_trip_and_consistency(tmp_path):
    d = tmp_path / "p"
    _write(d, GOOD)
    other = _bad(device_type="cpu")
    _write(d, other)
    profs = load_profiles(d)
    assert set(profs["m"]) == {"gpu-x", "cpu"}
    # save -> load keeps every cell
    out = tmp_path / "q"
    out.mkdir()
    for p in profs["m"].values():
        p.save(out / p.file_name())
    again = load_profiles(out)
    assert again["m"]["gpu-x"].table == profs["m"]["gpu-x"].table
    # a second file for the same pair, or disagreeing cuts, are refused
    _write(d, GOOD, "dup.blocks.json")
    with pytest.raises(ProfileFormatError, match="second profile"):
        load_profiles(d)
    (d / "dup.blocks.json").unlink()
    _write(d, _bad(device_type="cpu", cut_bytes=[9, 1]))
    with pytest.raises(ProfileFormatError, match="cut 0"):
        load_profiles(d)
    with pytest.raises(ProfileFormatError, match="does not exist"):
        load_profiles(tmp_path / "nowhere")
    with pytest.raises(MissingCellError, match="model"):
        load_profiles(out, models=["m", "n"])


def test_cluster_file_types_links_and_errors(tmp_path):
    _write(tmp_path / "p", GOOD)
    profs = load_profiles(tmp_path / "p")
    doc = {"format": "av_infer.cluster", "version": 1, "device_types": [
        {"name": "GPU-X", "count": 8, "gpus_per_server": 4, "link_gbps": 50,
         "link_latency_us": 12.5, "fractions": [1, 2]},
        {"name": "h100", "count": 2, "link_gbps": 100}]}
    c = parse_cluster_doc(doc, profs)
    assert c.counts == (("gpu-x", 8), ("h100", 2))
    gx, h = c.types
    assert (gx.source, gx.gpus_per_server, gx.link_gbps, gx.link_us, gx.fractions) == \
        ("measured", 4, 50.0, 12.5, (1, 2))
    assert h.source == "derived" and h.link_us == 0.0  # built in, links from the file
    assert c.describe()["gpu-x"]["count"] == 8
    bad = copy.deepcopy(doc)
    bad["device_types"][0]["name"] = "tpu-z"
    with pytest.raises(UnknownDeviceTypeError, match="tpu-z"):
        parse_cluster_doc(bad, profs)
    for key, val in (("count", 0), ("gpus_per_server", 1.5), ("link_gbps", 0),
                     ("link_gbps", float("inf")), ("link_latency_us", -1),
                     ("fractions", [0])):
        bad = copy.deepcopy(doc)
        bad["device_types"][0][key] = val
        with pytest.raises(ProfileFormatError):
            parse_cluster_doc(bad, profs)
    with pytest.raises(ProfileUnitsError):
        parse_cluster_doc({**doc, "bandwidth_unit": "MB/s"}, profs)
    f = tmp_path / "c.json"
    f.write_text(json.dumps(doc))
    assert resolve_cluster(str(f), profs).counts == c.counts
    assert load_cluster_file(f, profs).types[0].gpus_per_server == 4
    # a cluster type without a profile of every model is named, not silently skipped
    with pytest.raises(MissingCellError, match="m@h100"):
        require_types(profs, [t.name for t in c.types])


def test_spec_with_profiles_defines_any_type(tmp_path):
    _write(tmp_path / "p", GOOD)
    profs = load_profiles(tmp_path / "p")
    c = cluster_from_profiles("gpu-x:3,orin:2", profs)
    gx, orin = c.types
    assert gx.source == "measured" and gx.simulated and orin.source == "derived"
    with pytest.raises(UnknownDeviceTypeError, match="gpu-y"):
        cluster_from_profiles("gpu-y:1", profs)
    with pytest.raises(UnknownDeviceTypeError):
        resolve_cluster("gpu-x:1")  # without profiles the name means nothing
