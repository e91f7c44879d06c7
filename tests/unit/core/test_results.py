"""The run's headline numbers (fedper.results), against values computed by hand."""

import json

import numpy as np
import pytest

from fedper.results import ClientRecord, RunRecorder

# Two clients, rounds 1-5 at their start, then the final point after round 5 (recorded as 6).
ACCURACIES = {
    0: [0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
    1: [1.0, 0.5, 0.5, 0.5, 0.5, 0.0],
}
SAMPLES = {0: 10, 1: 30}


def _recorder(with_final: bool = True) -> RunRecorder:
    recorder = RunRecorder({})
    for client, accuracies in ACCURACIES.items():
        for rnd, acc in enumerate(accuracies, start=1):
            final = rnd == 6
            if final and not with_final:
                continue
            trained = None if final else 0.5
            recorder.add(ClientRecord("fedper", rnd, client, SAMPLES[client], acc, trained, trained, final=final))
    return recorder


def test_headline_is_the_final_point_and_last5_averages_each_clients_last_five_points():
    final = _recorder().final("fedper")
    assert final["final_round"] == 6 and final["final_after_round"] == 5
    assert final["final_point"] == "after round 5"
    assert final["final_per_client"] == {"0": 1.0, "1": 0.0}
    assert final["final_mean_accuracy"] == pytest.approx(0.5)
    assert final["final_weighted_mean_accuracy"] == pytest.approx((10 * 1.0 + 30 * 0.0) / 40)
    assert final["final_std"] == pytest.approx(0.5)
    # Rounds 2-6: client 0 (0.2 + 0.4 + 0.6 + 0.8 + 1.0) / 5 = 0.6, client 1 (4 * 0.5 + 0.0) / 5 = 0.4;
    # their mean 0.5, their population std 0.1.
    assert final["last5_rounds"] == [2, 3, 4, 5, 6]
    assert final["last5_per_client"] == pytest.approx({"0": 0.6, "1": 0.4})
    assert final["last5_mean_accuracy"] == pytest.approx(0.5)
    assert final["last5_std"] == pytest.approx(0.1)


def test_a_client_missing_at_some_points_is_averaged_over_those_it_has():
    recorder = _recorder()
    recorder.add(ClientRecord("fedper", 5, 2, 20, 0.3))
    recorder.add(ClientRecord("fedper", 6, 2, 20, 0.5, final=True))
    final = recorder.final("fedper")
    # Client 2: (0.3 + 0.5) / 2 = 0.4; mean of 0.6, 0.4, 0.4 = 1.4 / 3.
    assert final["last5_per_client"] == pytest.approx({"0": 0.6, "1": 0.4, "2": 0.4})
    assert final["last5_mean_accuracy"] == pytest.approx(1.4 / 3)
    assert final["final_per_client"] == {"0": 1.0, "1": 0.0, "2": 0.5}


def test_a_run_without_a_final_point_says_its_headline_is_the_start_of_the_last_round():
    final = _recorder(with_final=False).final("fedper")
    assert final["final_round"] == 5 and final["final_after_round"] is None
    assert final["final_point"] == "start of round 5"
    assert final["final_per_client"] == {"0": 0.8, "1": 0.5}
    # Fewer than 5 later points are not invented: rounds 1-5, client 0 0.4, client 1 0.6.
    assert final["last5_rounds"] == [1, 2, 3, 4, 5]
    assert final["last5_mean_accuracy"] == pytest.approx(0.5)
    assert final["last5_std"] == pytest.approx(0.1)


def test_results_json_and_metrics_csv_mark_the_final_point(tmp_path):
    _recorder().write(tmp_path, plots=False)
    rounds = json.loads((tmp_path / "results.json").read_text())["rounds"]["fedper"]
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5, 6]
    assert rounds[-1]["final"] is True and rounds[-1]["after_round"] == 5
    assert "accuracy_after" not in rounds[-1] and not any("final" in r for r in rounds[:-1])
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0].split(",")[-1] == "final"
    # Rows by round, then client: the final point's rows come last.
    assert lines[-2:] == ["fedper,6,0,10,1.0,,,True", "fedper,6,1,30,0.0,,,True"]
    assert lines[1].startswith("fedper,1,0,") and lines[2].startswith("fedper,1,1,")


def test_arrival_order_of_reports_does_not_change_the_files(tmp_path):
    """A fleet's devices report in whatever order they finish; the run's files must not show it."""
    rng = np.random.default_rng(3)
    records = [
        ClientRecord("fedper", rnd, client, int(rng.integers(50, 200)), float(rng.random()), float(rng.random()),
                     float(rng.random() * 2))
        for rnd in (1, 2) for client in range(7)
    ]  # fmt: skip
    outputs = []
    for order in (records, records[::-1], [records[i] for i in rng.permutation(len(records))]):
        recorder = RunRecorder({})
        for record in order:
            recorder.add(record)
        out = tmp_path / str(len(outputs))
        recorder.write(out, plots=False)
        outputs.append(((out / "results.json").read_bytes(), (out / "metrics.csv").read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]
