"""distmuon.plan / profiles: the same plan as `distmuon plan --json`, as Python objects."""
import json
import subprocess

import pytest

import distmuon


def cli_json(cli, *args):
    return json.loads(subprocess.run([cli, *args], check=True, capture_output=True,
                                     text=True).stdout)


@pytest.mark.parametrize("algorithm", ["standard", "auto"])
def test_plan_of_a_model_equals_cli(cli, algorithm):
    p = distmuon.plan("llama3-70b", group_size=8, profile="gb200", algorithm=algorithm)
    want = cli_json(cli, "plan", "--model", "llama3-70b", "-G", "8", "--profile", "gb200",
                    "--ns-algorithm", algorithm, "--json")
    assert p.units == "seconds" and want["units"] == "seconds"
    assert p.totals == want["totals"]
    assert p.weights == want["weights"]
    assert p.options == want["options"]
    assert "auto" in str(p)


def test_plan_defaults_are_the_cli_defaults(cli):
    # Nothing but the model given on either side: the same plan (NS algorithm standard, G 8,
    # no profile, refined model, bf16).
    p = distmuon.plan("llama3-70b")
    want = cli_json(cli, "plan", "--model", "llama3-70b", "--json")
    assert p.options == want["options"]
    assert p.totals == want["totals"] and p.weights == want["weights"]


def test_plan_of_shapes_without_profile():
    p = distmuon.plan([(4096, 1024), ("fc2", 1024, 4096, 3)], group_size=2, partition_dim=0)
    assert p.units == "flops"
    assert [(w["m"], w["n"], w["count"]) for w in p.weights] == [(4096, 1024, 1),
                                                                   (1024, 4096, 3)]
    for w in p.weights:
        assert w["mode"] and w["cost"]["duplicated"] > 0 and "breakdown" in w
    cross = distmuon.plan([(4096, 1024)], group_size=2, profile="h100", crosses_domain=True)
    local = distmuon.plan([(4096, 1024)], group_size=2, profile="h100", crosses_domain=False)
    assert cross.totals["duplicated"] > local.totals["duplicated"]  # slower links across domains


def test_profiles_and_errors(cli):
    names = [p["name"] for p in distmuon.profiles()]
    assert "h100" in names and "gb200" in names
    with pytest.raises(distmuon.Error, match="nope"):
        distmuon.plan([(8, 8)], profile="nope")
    with pytest.raises(distmuon.Error, match="either shapes or a model"):
        distmuon.plan()


def test_calibrate_writes_a_profile_that_plan_accepts(tmp_path):
    out = tmp_path / "calibrated.json"
    profile, report = distmuon.calibrate(None, name="here", sizes=(32, 64), out=out)
    assert profile["name"] == "here" and out.exists()
    assert json.loads(out.read_text()) == profile
    assert [f.name for f in tmp_path.iterdir()] == ["calibrated.json"]  # no temporary left
    assert "GFLOP/s" in report or "gflop" in report.lower()
    p = distmuon.plan([(256, 64)], group_size=1, profile=str(out))
    assert p.units == "seconds" and p.totals["duplicated"] > 0


def test_calibrate_refuses_an_output_it_cannot_write(tmp_path):
    # Checked before the measurements, as `distmuon calibrate --out`.
    with pytest.raises(distmuon.Error, match="is a directory"):
        distmuon.calibrate(None, sizes=(32,), out=tmp_path)
    with pytest.raises(distmuon.Error, match="does not exist"):
        distmuon.calibrate(None, sizes=(32,), out=tmp_path / "missing" / "p.json")
    assert list(tmp_path.iterdir()) == []
