"""The demo's report: the paired comparison, and a page that renders whatever a run can hold and
shows only the run's own numbers."""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedper._recipes.demo import base_source, demo_setup, traffic
from fedper._recipes.demo_config import DemoConfig
from fedper._recipes.demo_report import compare, render_report, write_report
from fedper.common.errors import FedperError
from fedper.plots import ACCURACY_PLOT, CLIENT_PLOT, NEW_USERS_PLOT
from fedper.pretrained import PACKAGED_CARD
from fedper.results import ClientRecord, RunRecorder
from fedper.run_results import DemoSummary, Export, PretrainedBase, RunResults, load_results, parse_results
from tests.support.schema_strategies import from_schema

# A demo run's results as the schema allows them: any shape a run could write, the demo's part
# always there (the page is drawn for demo runs).
DEMO_RUNS = st.builds(
    lambda run, demo: parse_results({**run, "demo": demo}, "generated"),
    from_schema(RunResults.model_json_schema()),
    from_schema(DemoSummary.model_json_schema()),
)
# How the page formats a number (demo_report.num): (format spec, scale).
FORMATS = ((".3f", 1), ("+.1f", 100), (".1f", 100), ("d", 1), (",", 1), (",.0f", 1), (".3g", 1), ("g", 1),
           (".2f", 1), (".0f", 1))  # fmt: skip
# The digits of the page's own words (ratings 1-5, the 80/20 split, kp=0, batch 32, last-5,
# MobileNet-V1, sha256, L2 norm): no number of the run is written outside a <data> element.
STATIC_NUMBERS = {"0", "1", "2", "5", "20", "32", "80", "256"}


class _Page(HTMLParser):
    """The page's <data> elements (value, text) and its text outside them (no style, no title)."""

    def __init__(self) -> None:
        super().__init__()
        self.data: list[tuple[str, str]] = []
        self.text: list[str] = []
        self._open: str | None = None  # the value of the <data> element being read
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "data":
            assert self._open is None, "a <data> element inside another"
            self._open, self._chunks = dict(attrs)["value"] or "", []
        elif tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "data":
            self.data.append((self._open or "", "".join(self._chunks)))
            self._open = None
        elif tag in ("style", "title"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._chunks.append(data)
        elif not self._skip:
            self.text.append(data)


def _numbers_and_strings(node: Any, numbers: set[float], strings: set[str]) -> None:
    if isinstance(node, bool):
        return
    if isinstance(node, int | float):
        numbers.add(float(node))
    elif isinstance(node, str):
        strings.add(node)
    elif isinstance(node, dict):
        for k, v in node.items():
            strings.add(k)
            if re.fullmatch(r"[0-9]+", k):
                numbers.add(float(k))
            _numbers_and_strings(v, numbers, strings)
    elif isinstance(node, list):
        for v in node:
            _numbers_and_strings(v, numbers, strings)


def _shown(value: str) -> float:
    return float(int(value)) if re.fullmatch(r"-?\d+", value) else float(value)


def _formats(value: str) -> set[str]:
    number: int | float = int(value) if re.fullmatch(r"-?\d+", value) else float(value)
    out = set()
    for spec, scale in FORMATS:
        with contextlib.suppress(ValueError):  # "d" of a float
            out.add(format(number * scale, spec))
    return out


def _must_show(results: RunResults) -> set[float]:
    """The numbers a reader comes for: each of them must be on the page."""
    want: list[float | None] = []
    for a in results.algorithms.values():
        want += [a.final_mean_accuracy, a.final_weighted_mean_accuracy, a.final_std, a.last5_mean_accuracy, a.last5_std]
    for b in results.baselines.values():
        want += [b.mean_accuracy, b.std]
    if results.new_users is not None:
        want += [results.new_users.steps, *results.new_users.sizes]
        for curve in results.new_users.curves.values():
            want += [x for p in curve.values() for x in (p.mean, p.se if p.mean is not None else None)]
    for p in results.privacy.values():
        want += [p.epsilon, p.delta, p.rounds, p.noise_multiplier, p.sampling_probability, p.clip_norm]
    demo = results.demo
    assert demo is not None
    s = demo.setup
    want += [s.devices, s.rounds, s.local_epochs, s.batch_size, s.learning_rate, s.momentum, s.kp, s.workers, s.seed,
             *s.images_per_user, demo.step_ms, *demo.timings.values(), *demo.export.sizes.values()]  # fmt: skip
    for t in demo.traffic.values():
        want += [t.up, t.down, t.rounds, t.up_per_device_round, t.down_per_device_round]
    c = demo.comparison
    if c is not None and c.difference is not None and {"fedper", "fedavg"} <= set(results.algorithms):
        want += [c.difference, c.standard_error, c.devices, c.devices_won, c.devices_lost]
    if s.secure is not None:
        want += [s.secure.neighbours, s.secure.threshold, s.secure.clip, s.secure.weight_cap]
    if isinstance(demo.base, PretrainedBase):
        card = demo.base.card
        want += [card.epochs, card.images, card.image_size, card.seed, card.category_accuracy, *card.looks.values()]
    if results.environment is not None:
        want.append(results.environment.torch_threads)
    return {float(x) for x in want if x is not None}


EMPTY_DIR = Path(tempfile.mkdtemp(prefix="fedper-report-"))  # no plots: the page says they are missing


@settings(max_examples=300, deadline=None)
@given(results=DEMO_RUNS)
def test_the_page_renders_any_demo_run_and_every_number_on_it_is_the_runs(results: RunResults) -> None:
    page = render_report(results, EMPTY_DIR)
    parsed = _Page()
    parsed.feed(page)
    numbers: set[float] = set()
    strings: set[str] = {str(EMPTY_DIR)}
    _numbers_and_strings(results.model_dump(mode="json"), numbers, strings)
    shown = set()
    for value, text in parsed.data:
        assert text in _formats(value), f"<data value={value!r}> shows {text!r}"
        assert _shown(value) in numbers, f"{value} is on the page but not in the results"
        shown.add(_shown(value))
    missing = _must_show(results) - shown
    assert not missing, f"numbers of the run the page does not show: {sorted(missing)}"
    # Outside <data>: the page's own words, and the run's names and texts, and nothing else.
    text = " ".join(parsed.text)
    for s in sorted(strings, key=len, reverse=True):  # whole words: a name "0" is not the 0 of "80%"
        if s:
            text = re.sub(rf"(?<!\w){re.escape(s)}(?!\w)", " ", text)
    assert set(re.findall(r"[0-9]+", text)) <= STATIC_NUMBERS, (sorted(set(re.findall(r"[0-9]+", text))), text)


def _cells(page: str) -> str:
    """The page with its <data> elements replaced by their text: its tables as a reader sees them."""
    return re.sub(r"</?data[^>]*>", "", page)


def _recorded(algorithms: dict[str, float], rounds: int = 5, clients: int = 10, seed: int = 0) -> RunRecorder:
    """A recorder with rounds 1..rounds and the final point, each client near its algorithm's level."""
    recorder = RunRecorder({})
    rng = np.random.default_rng(seed)
    for algorithm, level in algorithms.items():
        for rnd in range(1, rounds + 2):
            for client in range(clients):
                acc = float(np.clip(level + rng.normal(0, 0.03), 0, 1))
                final = rnd == rounds + 1
                recorder.add(ClientRecord(algorithm, rnd, client, 100, acc, None if final else acc,
                                          None if final else 1.0, final=final))  # fmt: skip
    return recorder


def _demo(recorder: RunRecorder, config: DemoConfig, init: Path = Path("pretrained")) -> DemoSummary:
    measured = recorder.results()
    rounds = {a: sum(not r.final for r in rows) for a, rows in measured.rounds.items()}
    return DemoSummary(
        setup=demo_setup(config), base=base_source(init), step_ms=87.0, timings={"total": 500.0},
        traffic={a: traffic(100, 600, rounds[a], config.devices) for a in measured.algorithms},
        export=Export(sizes={"train.pte": 123}, seconds=10.0), comparison=compare(measured),
    )  # fmt: skip


def test_the_demo_page_says_what_the_numbers_mean(tmp_path: Path) -> None:
    recorder = _recorded({"fedper": 0.45, "fedavg": 0.35})
    recorder.baselines = {"majority": [0.366] * 10}
    recorder.environment = {"torch": "2.14.1", "python": "3.11", "cpu": "Some CPU", "machine": "x86_64",
                            "cpu_capability": "AVX2", "torch_threads": 1}  # fmt: skip
    recorder.demo = _demo(recorder, DemoConfig())
    results = recorder.write(tmp_path)
    c = results.demo.comparison  # type: ignore[union-attr]
    assert c is not None and c.difference == pytest.approx(0.10, abs=0.05) and c.devices_won >= 9
    # The paired comparison is of the final point (after round 5), not of round 5's start.
    finals = {a: {str(r.client): r.accuracy for r in recorder.records(a) if r.final} for a in ("fedper", "fedavg")}
    assert c.difference == pytest.approx(np.mean([finals["fedper"][k] - finals["fedavg"][k] for k in finals["fedper"]]))
    assert c.fedper_last_rounds == results.algorithms["fedper"].last5_mean_accuracy and c.last_rounds == 5
    page = write_report(tmp_path).read_text()
    assert load_results(tmp_path) == results  # what the page was drawn from is what the run wrote
    plain = re.sub(r"<[^>]+>", "", page)
    assert "this run: Some CPU, torch 2.14.1, kernel set AVX2, 1 thread(s) per worker" in plain
    assert "baseline: majority" in plain and "most common rating scores 0.366" in plain and "is above it" in plain
    assert "Seed 0" in plain and "RESULTS.md" not in page  # the report's claims come from its own numbers
    card = json.loads(PACKAGED_CARD.read_text())
    assert card["base"]["sha256"] in page and "no rating, taste vector" in page and "fedper pretrain" in page
    assert "kp=1 (the top 1 layer(s), the ordinal classifier first" in plain
    assert "beat one global model" in plain and "FedPer wins on" in plain
    assert page.count("data:image/png;base64,") == 2 and 'src="http' not in page
    assert (
        "<td>after round 5</td>" in page and "20 rounds per algorithm (fedper ran 5, fedavg ran 5)" in plain
    )  # asked for 20
    # Per device per round: the final point is no round of traffic (5 rounds of 10 devices, not 6).
    assert "<tr><td>fedper</td><td>600</td><td>100</td><td>12</td><td>2</td></tr>" in _cells(page)

    # The same report for a run where FedPer does not win says so.
    recorder = _recorded({"fedper": 0.35, "fedavg": 0.9})
    recorder.demo = _demo(recorder, DemoConfig())
    recorder.write(tmp_path)
    assert "did not beat FedAvg in this run" in write_report(tmp_path).read_text()


def test_a_fleet_that_recorded_nothing_gives_a_page_that_says_so(tmp_path: Path) -> None:
    recorder = _recorded({"fedper": 0.45})
    recorder.demo = _demo(recorder, DemoConfig(), Path("scratch"))
    results = recorder.write(tmp_path)
    assert compare(results) is None
    page = write_report(tmp_path).read_text()
    assert "The fedavg fleet recorded no round, so there is no comparison: see server-fedavg.log" in page
    assert "Random initial weights" in page


def test_one_new_user_at_a_point_has_no_spread_and_the_page_renders(tmp_path: Path) -> None:
    """`fedper demo --seed 7`: a new-user point covered by one user has no standard error."""
    recorder = _recorded({"fedper": 0.45, "fedavg": 0.35}, clients=3)
    point = {"users": 2, "mean": 0.4321, "std": 0.1, "se": 0.0707, "per_user": {"0": 0.3, "1": 0.5}}
    alone = {"users": 1, "mean": 0.25, "std": 0.0, "se": None, "per_user": {"1": 0.25}}
    recorder.new_users = {
        "users": [7, 8], "pool_sizes": [40, 120], "test_sizes": [10, 30], "sizes": [0, 5, 100, 200], "steps": 50,
        "curves": {"fedper: head": {"0": point, "5": point, "100": alone, "200": {"users": 0}},
                   "scratch": {"0": point, "5": point, "100": alone, "200": {"users": 0}}},
    }  # fmt: skip
    recorder.demo = _demo(recorder, DemoConfig(), Path("scratch"))
    recorder.write(tmp_path)
    page = write_report(tmp_path).read_text()
    plain = re.sub(r"<[^>]+>", "", page)
    assert "how many ratings until the phone knows my taste" in plain
    assert page.count("data:image/png;base64,") == 3  # the new-users plot is embedded too
    cells = _cells(page)
    assert "<tr><td>5</td><td>2</td><td>0.432 ± 0.071</td><td>0.432 ± 0.071</td></tr>" in cells
    assert "<tr><td>100</td><td>1</td><td>0.250 (one user)</td><td>0.250 (one user)</td></tr>" in cells
    assert "<tr><td>200</td><td>0</td><td>-</td><td>-</td></tr>" in cells


def test_the_page_is_drawn_again_from_a_finished_run_and_missing_plots_are_redrawn(tmp_path: Path) -> None:
    recorder = _recorded({"fedper": 0.45, "fedavg": 0.35}, clients=4)
    recorder.demo = _demo(recorder, DemoConfig(devices=4), Path("scratch"))
    recorder.write(tmp_path)
    first = write_report(tmp_path).read_text()
    for plot in (ACCURACY_PLOT, CLIENT_PLOT):
        (tmp_path / plot).unlink()
    (tmp_path / "report.html").unlink()
    from fedper.cli import main

    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / ACCURACY_PLOT).exists() and (tmp_path / "report.html").read_text() == first
    assert not (tmp_path / NEW_USERS_PLOT).exists()  # a run without new users has no such plot
    (tmp_path / "results.json").write_text('{"algorithms": {"fedper": {"final_mean_accuracy": 2}}}')
    with pytest.raises(FedperError, match=r"results.json is not a run's results: .*algorithms.fedper.final_mean_accuracy: "
                       "Input should be less than or equal to 1"):  # fmt: skip
        write_report(tmp_path)


def test_demo_dp_runs_both_servers_with_dp_and_reports_what_they_spent(tmp_path: Path) -> None:
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
    recorder = _recorded({"fedper": 0.45, "fedavg": 0.35})
    spent = {"epsilon": 3.21, "delta": 0.0005, "rounds": 4, "noise_multiplier": 0.8, "sampling_probability": 0.5,
             "clip_norm": 0.9, "target_epsilon": None}  # fmt: skip
    recorder.privacy = {"fedper": spent, "fedavg": {**spent, "epsilon": None}}
    recorder.demo = _demo(recorder, config)
    recorder.write(tmp_path)
    plain = re.sub(r"<[^>]+>", "", write_report(tmp_path).read_text())
    assert "fedper: epsilon 3.21 at delta 0.0005 after 4 noised rounds" in plain
    assert "fedavg: epsilon infinite (no noise)" in plain and "last clip norm 0.9" in plain
    assert "each device drawn with the DP sampling probability in each round" in plain


def test_demo_secagg_runs_both_servers_with_secure_rounds_and_says_so(tmp_path: Path) -> None:
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
    assert demo_setup(DemoConfig()).secure is None
    recorder = _recorded({"fedper": 0.45, "fedavg": 0.35})
    recorder.demo = _demo(recorder, config)
    recorder.write(tmp_path)
    plain = re.sub(r"<[^>]+>", "", write_report(tmp_path).read_text())
    assert "k = 8 others, any t = 5 of whom" in plain and "L2 norm 1" in plain
    with pytest.raises(ConfigError, match="--devices >= 3"):
        DemoConfig(devices=2, secure=SecAggConfig(secagg=True))
    dp = DPConfig(dp=True, dp_count_stddev=1.0)
    with pytest.raises(ConfigError, match="--dp-round-seconds above"):
        DemoConfig(secure=SecAggConfig(secagg=True, secagg_stage_timeout=10.0), privacy=dp)  # 20 s < 2 + 30
    both = DemoConfig(secure=SecAggConfig(secagg=True, secagg_stage_timeout=10.0), privacy=dp, dp_round_seconds=60)
    assert both.server_options()["round_timeout"] == 60
    secure = demo_setup(both).secure
    assert secure is not None and secure.clip is None and secure.weight_cap == 1  # under DP: the round's clip


@pytest.mark.filterwarnings("ignore:Glyph")  # generated names in scripts DejaVu Sans lacks
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(results=DEMO_RUNS)
def test_every_plot_draws_for_any_run(results: RunResults) -> None:
    from fedper.plots import plot_run

    with tempfile.TemporaryDirectory() as out:
        paths = plot_run(results, Path(out))
        assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
        assert (Path(out) / NEW_USERS_PLOT in paths) == (results.new_users is not None)
