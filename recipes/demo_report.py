"""The demo's report: FedPer against FedAvg per device, and the self-contained HTML page.

The page is drawn from the run's ``results.json`` alone (and the plots beside it), so ``fedper
report RUN_DIR`` draws it again from a finished run. Every number on it is a value of the
results, shown in an HTML ``<data>`` element whose ``value`` is the number exactly as stored;
the page renders whatever a run can hold (an algorithm that did not run, a point with one
user, no baselines, a fleet that stopped early).
"""

from __future__ import annotations

import base64
import html
import statistics
import string
from pathlib import Path

from fedper.baselines import DESCRIPTIONS
from fedper.common.atomic_write import atomic_write_text
from fedper.common.errors import FedperError
from fedper.plots import ACCURACY_PLOT, CLIENT_PLOT, NEW_USERS_PLOT, plot_run
from fedper.run_results import (
    AlgorithmSummary,
    BaseSource,
    CheckpointBase,
    Comparison,
    DemoSummary,
    Environment,
    NewUsers,
    PrivacySummary,
    RunResults,
    ScratchBase,
    SecureSetup,
    load_results,
)

REPORT_FILE = "report.html"
PAIR = ("fedper", "fedavg")


def compare(results: RunResults) -> Comparison | None:
    """FedPer vs FedAvg per device (same users, same test photos): the paired difference of the
    final accuracies (after the last round) with its standard error, devices won and lost, and
    both ``last5_mean_accuracy``; None when either fleet recorded no round."""
    algos = results.algorithms
    if any(a not in algos for a in PAIR):
        return None
    fp, fa = algos["fedper"].final_per_client, algos["fedavg"].final_per_client
    diffs = [fp[c] - fa[c] for c in fp if c in fa]
    return Comparison(
        devices=len(diffs),
        difference=statistics.fmean(diffs) if diffs else None,
        standard_error=statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None,
        devices_won=sum(d > 0 for d in diffs),
        devices_lost=sum(d < 0 for d in diffs),
        fedper_last_rounds=algos["fedper"].last5_mean_accuracy,
        fedavg_last_rounds=algos["fedavg"].last5_mean_accuracy,
        last_rounds=len(algos["fedper"].last5_rounds),
    )


def num(value: float | None, spec: str = ".3f", scale: int = 1) -> str:
    """A number of the results as the page shows it: its text formatted, its exact value in the
    element (``scale``: 100 for percentage points); "-" for a value the run does not have."""
    if value is None:
        return "-"
    return f'<data value="{value!r}">{format(value * scale, spec)}</data>'


def esc(text: str) -> str:
    return html.escape(text)


def _missing_fleets(results: RunResults) -> str:
    missing = [a for a in PAIR if a not in results.algorithms]
    logs = " and ".join(f"server-{a}.log" for a in missing)
    return (
        f"The {' and '.join(missing)} fleet recorded no round, so there is no comparison: see {logs} in this "
        "directory. "
    )


def _meaning(results: RunResults, demo: DemoSummary) -> str:
    """The page's first paragraph: what this run's numbers say, and how sure they are."""
    c = demo.comparison
    if c is None:
        text = _missing_fleets(results)
    elif c.difference is None:
        text = "No device was evaluated at the end by both fleets, so there is no paired comparison. "
    else:
        setup = demo.setup
        budget = (
            f"with {num(setup.rounds, 'd')} rounds of {num(setup.local_epochs, 'd')} local epochs on "
            f"{num(setup.images_per_user[0], 'd')}-{num(setup.images_per_user[1], 'd')} photos per user, personal "
            "heads have had little data and time to learn each taste, and each device's test split is a few dozen "
            "photos (one photo moves its accuracy by several points). "
        )
        fl, al = c.fedper_last_rounds, c.fedavg_last_rounds
        ahead = c.difference > 0 and (fl is None or al is None or fl > al)
        sure = c.standard_error is not None and c.difference > 2 * c.standard_error
        if ahead and sure:
            text = (
                f"FedPer's personal heads beat one global model by {num(c.difference, '+.1f', 100)} points of device "
                "accuracy: users disagree about what makes a good photo, and a shared feature extractor with a "
                "personal head follows each user's taste, as in the FedPer paper's FLICKR-AES result. "
            )
        elif ahead:
            text = (
                f"FedPer is ahead of FedAvg, as in the FedPer paper's FLICKR-AES result, but not conclusively: {budget}"
            )
        else:
            text = f"FedPer did not beat FedAvg in this run: {budget}"
        spread = (
            f"± {num(c.standard_error, '.1f', 100)} points (standard error over {num(c.devices, 'd')} devices)"
            if c.standard_error is not None
            else f"(one device: no spread; {num(c.devices, 'd')} device in common)"
        )
        text += (
            f"Per device (same users, same test photos), FedPer minus FedAvg is {num(c.difference, '+.1f', 100)} "
            f"{spread}; FedPer wins on {num(c.devices_won, 'd')} devices and loses on {num(c.devices_lost, 'd')}. "
        )
        if c.fedper_last_rounds is not None and c.fedavg_last_rounds is not None:
            text += (
                f"Each device's mean over the last {num(c.last_rounds, 'd')} evaluation points, averaged over "
                f"devices: FedPer {num(c.fedper_last_rounds)}, FedAvg {num(c.fedavg_last_rounds)}. "
            )
    return text + _against_baselines(results)


def _against_baselines(results: RunResults) -> str:
    """What this run's own baselines say about FedPer's number (nothing pasted from docs)."""
    majority, fedper = results.baselines.get("majority"), results.algorithms.get("fedper")
    if majority is None or fedper is None:
        return ""
    gap = fedper.final_mean_accuracy - majority.mean_accuracy
    side = "above" if gap > 0 else "not above"
    text = (
        f"On the same devices' test photos, predicting each device's most common rating scores "
        f"{num(majority.mean_accuracy)}: FedPer's {num(fedper.final_mean_accuracy)} is {side} it"
    )
    ceiling = results.baselines.get("per_client_features")
    if ceiling is not None:
        text += (
            f"; a per-device model on the generator's own features, the ceiling, scores {num(ceiling.mean_accuracy)}"
        )
    return text + "."


def _result_rows(results: RunResults) -> str:
    def row(name: str, a: AlgorithmSummary) -> str:
        cells = (num(a.final_mean_accuracy), num(a.final_weighted_mean_accuracy), num(a.final_std),
                 num(a.last5_mean_accuracy), num(a.last5_std))  # fmt: skip
        return f"<tr><td>{esc(name)}</td>{''.join(f'<td>{c}</td>' for c in cells)}<td>{esc(a.final_point)}</td></tr>"

    rows = "".join(row(name, a) for name, a in results.algorithms.items())
    rows += "".join(
        f"<tr><td>baseline: {esc(name)} <small>({esc(DESCRIPTIONS.get(name, ''))})</small></td>"
        f"<td>{num(b.mean_accuracy)}</td><td></td><td>{num(b.std)}</td><td></td><td></td><td></td></tr>"
        for name, b in results.baselines.items()
    )
    return rows


def _privacy_section(privacy: dict[str, PrivacySummary]) -> str:
    """With --dp: what each fleet's server reported it spent (docs/PRIVACY.md)."""
    if not privacy:
        return ""

    def spent(p: PrivacySummary) -> str:
        return "infinite (no noise)" if p.epsilon is None else num(p.epsilon, ".3g")

    def clip(p: PrivacySummary) -> str:
        return "" if p.clip_norm is None else f", last clip norm {num(p.clip_norm, '.3g')}"

    items = "".join(
        f"<li>{esc(a)}: epsilon {spent(p)} at delta {num(p.delta, '.3g')} after {num(p.rounds, 'd')} noised rounds "
        f"(noise multiplier {num(p.noise_multiplier, 'g')}, each device drawn with probability "
        f"{num(p.sampling_probability, 'g')}{clip(p)})</li>"
        for a, p in privacy.items()
    )
    return (
        "<h2>Privacy</h2><p>Both fleets ran DP-FedAvg: each device clipped its base delta, the server added "
        "Gaussian noise to their sum and published every round at its deadline; epsilon is what the server's "
        f"accountant (dp-accounting, RDP) reports at the end (docs/PRIVACY.md).</p><ul>{items}</ul>"
    )


def _secure_section(secure: SecureSetup | None, devices: int) -> str:
    """With --secagg: what the servers could see of each update (docs/SECAGG.md)."""
    if secure is None:
        return ""
    clip = "the round's DP clip norm" if secure.clip is None else f"L2 norm {num(secure.clip, 'g')}"
    return (
        "<h2>Secure aggregation</h2><p>Both fleets ran SecAgg+: in every round each device clipped its base "
        f"delta to {clip}, encoded it in fixed point with its weight (min(samples, {num(secure.weight_cap, 'd')})) "
        "and masked it with pairwise and self masks; the server learned only the round's sum. With all "
        f"{num(devices, 'd')} devices in a round, each shared its secrets with k = {num(secure.neighbours, 'd')} "
        f"others, any t = {num(secure.threshold, 'd')} of whom could recover them for the unmasking. The personal "
        "layers never left the devices either way. The traffic table includes the key, share and unmasking "
        "messages (docs/SECAGG.md).</p>"
    )


def _new_users_section(new_users: NewUsers | None, img: str) -> str:
    """New users' accuracy against their number of rated photos, as a plot and a table."""
    if new_users is None:
        return ""
    curves = new_users.curves
    head = "".join(f"<th>{esc(name)}</th>" for name in curves)
    sizes = sorted({int(n) for curve in curves.values() for n in curve} | set(new_users.sizes))
    rows = ""
    for n in sizes:
        cells, users = "", None
        for curve in curves.values():
            point = curve.get(str(n))
            if point is not None and (users is None or point.users > users):
                users = point.users
            if point is None or point.mean is None:
                cells += "<td>-</td>"
            elif point.se is None:
                cells += f"<td>{num(point.mean)} (one user)</td>"
            else:
                cells += f"<td>{num(point.mean)} ± {num(point.se)}</td>"
        rows += f"<tr><td>{num(n, 'd')}</td><td>{num(users, 'd')}</td>{cells}</tr>"
    return (
        "<h2>New users: how many ratings until the phone knows my taste?</h2><p>Users who never joined a fleet "
        "(the table counts them at each N) get each final model and train on their first N rated photos "
        f"({num(new_users.steps, 'd')} SGD steps whatever N); accuracy on their own test photos, mean ± standard "
        'error over users ("head": only the personal layers train; a fresh head first predicts the user\'s own '
        f"most frequent rating, set from those N ratings).</p>{img}"
        f"<table><tr><th>N photos</th><th>users</th>{head}</tr>{rows}</table>"
    )


def _base_section(base: BaseSource) -> str:
    """Where the server's version 0 came from, and what the pretrained base was taught."""
    compare_runs = (
        "<p>Pretrained against from scratch, FedPer against FedAvg over several seeds, and which cues the base "
        "carries: <code>make results</code> (its tables are in the project's docs). The same fleets from random "
        "weights: <code>fedper demo --init scratch</code>.</p>"
    )
    if isinstance(base, ScratchBase):
        return "<p>Random initial weights (<code>--init scratch</code>).</p>" + compare_runs
    text = f"<p>Checkpoint <code>{esc(base.path)}</code>, sha256 <code>{esc(base.sha256)}</code>; "
    if isinstance(base, CheckpointBase):
        return text + "the heads start fresh.</p>" + compare_runs
    card = base.card
    looks = ", ".join(f"{esc(k)} {num(v, '.2f')}" for k, v in card.looks.items())
    return (
        text + f"the base the toolkit ships, made by <code>fedper pretrain</code> at commit {esc(card.commit[:7])} "
        f"({num(card.epochs, 'd')} epochs on {num(card.images, ',')} unrated composites at "
        f"{num(card.image_size, 'd')} px, seed {num(card.seed, 'd')}). Raters: {esc(card.raters)}. It learned to "
        f"tell what a photo shows: held-out R² of the photographic properties: {looks}; content category accuracy "
        f"{num(card.category_accuracy, '.2f')} (chance: one in eight). The heads start fresh.</p>" + compare_runs
    )


def _environment(env: Environment | None) -> str:
    """What computed the floats, in words (fedper.environment)."""
    if env is None:
        return "not recorded"
    return (f"{esc(env.cpu)}, torch {esc(env.torch)}, kernel set {esc(env.cpu_capability)}, "
            f"{num(env.torch_threads, 'd')} thread(s) per worker")  # fmt: skip


def _rounds_run(demo: DemoSummary) -> str:
    ran = ", ".join(f"{esc(a)} ran {num(t.rounds, 'd')}" for a, t in demo.traffic.items())
    return f" ({ran})" if ran else ""


def render_report(results: RunResults, out: Path) -> str:
    """The page for a demo run's results, with the plots in ``out`` embedded."""
    demo = results.demo
    if demo is None:
        raise FedperError("these results have no demo part: the page is drawn for `fedper demo` runs")
    setup = demo.setup

    def img(name: str) -> str:
        path = out / name
        if not path.exists():
            return f"<p>(plot {esc(name)} missing: <code>fedper report {esc(str(out))}</code> draws it)</p>"
        data = base64.b64encode(path.read_bytes()).decode()
        return f'<img alt="{name}" src="data:image/png;base64,{data}">'

    traffic = "".join(
        f"<tr><td>{esc(a)}</td><td>{num(t.down, ',')}</td><td>{num(t.up, ',')}</td>"
        f"<td>{num(t.down_per_device_round, ',.0f')}</td><td>{num(t.up_per_device_round, ',.0f')}</td></tr>"
        for a, t in demo.traffic.items()
    )
    cohort = (
        "each device drawn with the DP sampling probability in each round"
        if setup.dp
        else "every device in every round it could join"
    )
    page = string.Template((Path(__file__).parent / "report_template.html").read_text())
    return page.substitute(
        meaning=_meaning(results, demo),
        rows=_result_rows(results),
        privacy=_privacy_section(results.privacy) + _secure_section(setup.secure, setup.devices),
        accuracy_plot=img(ACCURACY_PLOT),
        client_plot=img(CLIENT_PLOT),
        new_users=_new_users_section(results.new_users, img(NEW_USERS_PLOT)),
        base=_base_section(demo.base),
        kp=num(setup.kp, "d"),
        head=esc(setup.head),
        devices=num(setup.devices, "d"),
        images_per_user=f"{num(setup.images_per_user[0], 'd')}-{num(setup.images_per_user[1], 'd')}",
        engine=esc(setup.engine),
        workers=num(setup.workers, "d"),
        rounds=num(setup.rounds, "d"),
        rounds_run=_rounds_run(demo),
        cohort=cohort,
        local_epochs=num(setup.local_epochs, "d"),
        learning_rate=num(setup.learning_rate, "g"),
        momentum=num(setup.momentum, "g"),
        batch_size=num(setup.batch_size, "d"),
        seed=num(setup.seed, "d"),
        environment=_environment(results.environment),
        step_ms=num(demo.step_ms, ".0f"),
        timings=", ".join(f"{esc(k)} {num(v, '.0f')} s" for k, v in demo.timings.items()),
        sizes="".join(f"<tr><td>{esc(n)}</td><td>{num(s, ',')}</td></tr>" for n, s in demo.export.sizes.items()),
        traffic=traffic,
    )


def write_report(run_dir: Path) -> Path:
    """``run_dir/report.html`` from the run's results.json, drawing any plot that is missing
    first; what ``fedper demo`` ends with and ``fedper report`` does again."""
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    if results.demo is None:
        raise FedperError(f"{run_dir / 'results.json'} has no demo part: the page is drawn for `fedper demo` runs")
    wanted = [ACCURACY_PLOT, CLIENT_PLOT] + ([NEW_USERS_PLOT] if results.new_users is not None else [])
    if not all((run_dir / name).exists() for name in wanted):
        plot_run(results, run_dir)
    path = run_dir / REPORT_FILE
    atomic_write_text(path, render_report(results, run_dir))
    return path
