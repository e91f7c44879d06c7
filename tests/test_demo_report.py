"""The demo's report: the paired comparison and the page that explains it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedper._recipes.demo import base_source
from fedper._recipes.demo_config import DemoConfig
from fedper._recipes.demo_report import compare, render_report
from fedper.common.errors import FedperError
from fedper.pretrained import PACKAGED_CARD
from fedper.results import ClientRecord, RunRecorder


def test_demo_report_is_self_contained_and_says_what_the_numbers_mean(tmp_path):
    recorder = RunRecorder({})
    rng = np.random.default_rng(0)
    for algorithm, level in (("fedper", 0.45), ("fedavg", 0.35)):
        for rnd in range(1, 7):  # rounds 1-5, then the final point after round 5
            for client in range(10):
                acc = float(np.clip(level + rng.normal(0, 0.03), 0, 1))
                if rnd == 6:
                    recorder.add(ClientRecord(algorithm, rnd, client, 100, acc, final=True))
                else:
                    recorder.add(ClientRecord(algorithm, rnd, client, 100, acc, acc, 1.0))
    recorder.write(tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    results["demo"] = {"step_ms": 87.0, "timings": {"total": 500.0}, "traffic": {"fedper": {"up": 100, "down": 600}},
                       "export": {"sizes": {"train.pte": 123}}, "base": base_source(Path("pretrained"))}  # fmt: skip
    results["demo"]["comparison"] = c = compare(results)
    assert c["difference"] == pytest.approx(0.10, abs=0.05) and c["devices_won"] >= 9
    # The paired comparison is of the final point (after round 5), not of round 5's start.
    finals = {a: {str(r.client): r.accuracy for r in recorder.records(a) if r.final} for a in ("fedper", "fedavg")}
    assert c["difference"] == pytest.approx(
        np.mean([finals["fedper"][k] - finals["fedavg"][k] for k in finals["fedper"]])
    )
    assert c["fedper_last_rounds"] == results["algorithms"]["fedper"]["last5_mean_accuracy"]
    assert c["last_rounds"] == 5
    results["baselines"] = {"majority": {"mean_accuracy": 0.366, "std": 0.1, "per_client": {}}}
    results["environment"] = {"cpu": "Some CPU", "torch": "2.14.1", "cpu_capability": "AVX2", "torch_threads": 1}
    page = render_report(DemoConfig(), results, tmp_path)
    assert "this run: Some CPU, torch 2.14.1, kernel set AVX2, 1 thread(s) per worker" in page
    assert "baseline: majority" in page and "0.366" in page
    assert "most common rating scores 0.366: FedPer is above it" in page and "Seed 0" in page
    assert "RESULTS.md" not in page  # the report's claims come from its own numbers
    card = json.loads(PACKAGED_CARD.read_text())
    assert card["base"]["sha256"] in page and "no rating, taste vector" in page and "fedper pretrain" in page
    assert "kp=1 (the top 1 layer(s), the ordinal classifier first" in page
    assert "beat one global model" in page and "FedPer wins on" in page
    assert page.count("data:image/png;base64,") == 2 and 'src="http' not in page
    assert "<td>after round 5</td>" in page and "last 5 evaluation points" in page
    fedper_row = f"<td>{results['algorithms']['fedper']['final_mean_accuracy']:.3f}</td>"
    assert fedper_row + f"<td>{results['algorithms']['fedper']['final_weighted_mean_accuracy']:.3f}</td>" in page
    assert f"<td>{results['algorithms']['fedper']['last5_mean_accuracy']:.3f}</td>" in page
    # Per device per round: the final point is no round of traffic (5 rounds of 10 devices, not 6).
    assert "<td>fedper</td><td>600</td><td>100</td><td>12</td><td>2</td>" in page

    # The same report for a run where FedPer does not win says so.
    for record in results["algorithms"]["fedavg"]["final_per_client"]:
        results["algorithms"]["fedavg"]["final_per_client"][record] = 0.9
    results["algorithms"]["fedavg"]["last5_mean_accuracy"] = 0.9
    results["demo"]["comparison"] = compare(results)
    assert "did not beat FedAvg in this run" in render_report(DemoConfig(), results, tmp_path)


def test_a_fleet_that_recorded_nothing_is_a_clear_error():
    with pytest.raises(FedperError, match="the fedavg fleet recorded no round"):
        compare({"algorithms": {"fedper": {"final_per_client": {}}}, "rounds": {}})


def test_demo_report_shows_the_new_users_curve(tmp_path):
    recorder = RunRecorder({})
    for algorithm in ("fedper", "fedavg"):
        for client in range(3):
            recorder.add(ClientRecord(algorithm, 1, client, 100, 0.4, 0.4, 1.0))
            recorder.add(ClientRecord(algorithm, 2, client, 100, 0.5, final=True))
    point = {"users": 2, "mean": 0.4321, "std": 0.1, "se": 0.0707, "per_user": {"0": 0.3, "1": 0.5}}
    recorder.new_users = {
        "users": [7, 8], "pool_sizes": [40, 40], "test_sizes": [10, 10], "sizes": [0, 5, 50], "steps": 50,
        "curves": {"fedper: head": {"0": point, "5": point, "50": {"users": 0}}, "scratch": {"0": point, "5": point}},
    }  # fmt: skip
    recorder.write(tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    results["demo"] = {"step_ms": 87.0, "timings": {"total": 500.0}, "traffic": {}, "export": {"sizes": {}},
                       "base": base_source(Path("scratch"))}  # fmt: skip
    results["demo"]["comparison"] = compare(results)
    page = render_report(DemoConfig(), results, tmp_path)
    assert "how many ratings until the phone knows my taste" in page
    assert "Random initial weights" in page
    assert page.count("data:image/png;base64,") == 3  # the new-users plot is embedded too
    assert "<tr><td>5</td><td>2</td><td>0.432 ± 0.071</td><td>0.432 ± 0.071</td></tr>" in page
    assert "<tr><td>50</td><td>0</td><td>-</td><td>-</td></tr>" in page


def test_demo_dp_runs_both_servers_with_dp_and_reports_what_they_spent(tmp_path):
    from fedper.common.dp.config import DPConfig
    from fedper.common.errors import ConfigError
    from fedper.server.process import option_flags

    assert DemoConfig().privacy.dp_count_stddev == 1.0  # ten devices: the count's default noise would be too small
    privacy = DPConfig(dp=True, dp_noise_multiplier=0.8, dp_count_stddev=1.0, dp_sampling_probability=0.5)
    config = DemoConfig(devices=10, privacy=privacy)
    options = config.server_options()
    assert options["dp"] is True and options["checkin_window"] == 2.0 and options["round_timeout"] == 20.0
    assert options["cohort_size"] == 5 and options["dp_sampling_probability"] == 0.5
    flags = option_flags(options)
    assert "--dp" in flags and "--dp-delta" not in flags  # unset options keep the server's default
    assert "--target-clients" in flags and "--no-dp" not in flags
    assert "dp" not in DemoConfig().server_options()
    with pytest.raises(ConfigError, match="--dp-round-seconds"):
        DemoConfig(privacy=DPConfig(dp=True), dp_round_seconds=2)
    with pytest.raises(ConfigError, match="--dp-count-stddev"):
        DemoConfig(privacy=DPConfig(dp=True, dp_count_stddev=0.1))
    from fedper._recipes.demo_report import _privacy_section

    spent = {"epsilon": 3.21, "delta": 0.0005, "rounds": 4, "noise_multiplier": 0.8, "sampling_probability": 0.5,
             "clip_norm": 0.9, "target_epsilon": None}  # fmt: skip
    section = _privacy_section({"fedper": spent, "fedavg": {**spent, "epsilon": None}})
    assert "fedper: epsilon 3.21 at delta 0.0005 after 4 noised rounds" in section
    assert "fedavg: epsilon infinite (no noise)" in section
    assert _privacy_section(None) == ""


def test_demo_secagg_runs_both_servers_with_secure_rounds_and_says_so(tmp_path):
    from fedper._recipes.demo_report import _secure_section
    from fedper.common.dp.config import DPConfig
    from fedper.common.errors import ConfigError
    from fedper.common.secagg.config import SecAggConfig
    from fedper.server.process import option_flags

    config = DemoConfig(devices=10, secure=SecAggConfig(secagg=True, secagg_stage_timeout=10.0))
    options = config.server_options()
    assert options["checkin_window"] == 2.0 and options["start_devices"] == 10 and options["round_timeout"] == 600
    flags = option_flags(options)
    assert "--secagg" in flags and flags[flags.index("--secagg-stage-timeout") + 1] == "10.0"
    assert "--secagg" not in option_flags(DemoConfig().server_options())
    assert DemoConfig().secure.secagg_stage_timeout == 10.0  # the demo's devices are on the server's machine
    section = _secure_section(config)
    assert "k = 8 others, any t = 5 of whom" in section and "L2 norm 1" in section
    assert _secure_section(DemoConfig()) == ""
    with pytest.raises(ConfigError, match="--devices >= 3"):
        DemoConfig(devices=2, secure=SecAggConfig(secagg=True))
    dp = DPConfig(dp=True, dp_count_stddev=1.0)
    with pytest.raises(ConfigError, match="--dp-round-seconds above"):
        DemoConfig(secure=SecAggConfig(secagg=True, secagg_stage_timeout=10.0), privacy=dp)  # 20 s < 2 + 30
    both = DemoConfig(secure=SecAggConfig(secagg=True, secagg_stage_timeout=10.0), privacy=dp, dp_round_seconds=60)
    assert both.server_options()["round_timeout"] == 60 and "the round's DP clip norm" in _secure_section(both)
