"""The demo's report: FedPer against FedAvg per device, and the self-contained HTML page."""

from __future__ import annotations

import base64
import html
import os
import statistics
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedper._recipes.demo_config import DemoConfig
from fedper.baselines import DESCRIPTIONS
from fedper.common.errors import FedperError
from fedper.plots import NEW_USERS_PLOT


def compare(results: dict[str, Any]) -> dict[str, float]:
    """FedPer vs FedAvg per device (same users, same test photos): the paired difference of the
    final accuracies (after the last round) with its standard error, devices won, and both
    ``last5_mean_accuracy`` (each device's mean over the last 5 evaluation points, averaged)."""
    algos = results["algorithms"]
    missing = [a for a in ("fedper", "fedavg") if a not in algos]
    if missing:
        raise FedperError(f"the {' and '.join(missing)} fleet recorded no round: see its server log in the output")
    fp, fa = algos["fedper"]["final_per_client"], algos["fedavg"]["final_per_client"]
    diffs = [fp[c] - fa[c] for c in fp if c in fa]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return {
        "difference": float(statistics.fmean(diffs)),
        "standard_error": se,
        "devices_won": float(sum(d > 0 for d in diffs)),
        "devices_lost": float(sum(d < 0 for d in diffs)),
        "devices": float(len(diffs)),
        "fedper_last_rounds": float(algos["fedper"]["last5_mean_accuracy"]),
        "fedavg_last_rounds": float(algos["fedavg"]["last5_mean_accuracy"]),
        "last_rounds": float(len(algos["fedper"]["last5_rounds"])),
    }


def _against_baselines(fedper: float, baselines: dict[str, Any]) -> str:
    """What this run's own baselines say about FedPer's number (nothing pasted from docs)."""
    if "majority" not in baselines:
        return ""
    majority = baselines["majority"]["mean_accuracy"]
    side = "above" if fedper > majority else "not above"
    text = (
        f" On the same devices' test photos, predicting each device's most common rating scores {majority:.3f}: "
        f"FedPer is {side} it ({100 * (fedper - majority):+.1f} points)"
    )
    if "per_client_features" in baselines:
        ceiling = baselines["per_client_features"]["mean_accuracy"]
        text += f"; a per-device model on the generator's own features, the ceiling, scores {ceiling:.3f}"
    return text + "."


def _new_users_section(new_users: dict[str, Any] | None, img: Callable[[str], str]) -> str:
    """New users' accuracy against their number of rated photos, as a plot and a table."""
    if not new_users:
        return ""
    curves = new_users["curves"]
    head = "".join(f"<th>{html.escape(name)}</th>" for name in curves)
    rows = ""
    for n in new_users["sizes"]:
        cells = []
        for curve in curves.values():
            point = curve.get(str(n))
            cells.append(
                f"<td>{point['mean']:.3f} ± {point['se']:.3f}</td>" if point and point["users"] else "<td>-</td>"
            )
        users = max((c.get(str(n), {}).get("users", 0) for c in curves.values()), default=0)
        rows += f"<tr><td>{n}</td><td>{users}</td>{''.join(cells)}</tr>"
    return (
        f"<h2>New users: how many ratings until the phone knows my taste?</h2><p>{len(new_users['users'])} users "
        "who never joined a fleet get each final model and train on their first N rated photos "
        f"({new_users['steps']} SGD steps whatever N); accuracy on their own test photos, mean ± standard error "
        f'over users ("head": only the personal layers train; a fresh head first predicts the user\'s '
        f"own most frequent rating, set from those N ratings).</p>{img(NEW_USERS_PLOT)}"
        f"<table><tr><th>N photos</th><th>users</th>{head}</tr>{rows}</table>"
    )


def render_report(config: DemoConfig, results: dict[str, Any], out: Path) -> str:
    algos = results["algorithms"]
    demo = results["demo"]
    fp, fa = algos["fedper"]["final_mean_accuracy"], algos["fedavg"]["final_mean_accuracy"]
    c = demo["comparison"]
    evidence = (
        f"Per device (same users, same test photos), FedPer minus FedAvg is {100 * c['difference']:+.1f} "
        f"± {100 * c['standard_error']:.1f} points (standard error over {c['devices']:.0f} devices); FedPer wins on "
        f"{c['devices_won']:.0f} devices and loses on {c['devices_lost']:.0f}. Each device's mean over the last "
        f"{c['last_rounds']:.0f} evaluation points, averaged over devices: FedPer {c['fedper_last_rounds']:.3f}, "
        f"FedAvg {c['fedavg_last_rounds']:.3f}."
    )
    start = "from the pretrained base" if demo["base"]["kind"] == "pretrained" else "from " + demo["base"]["kind"]
    budget = (
        f"with {config.rounds} rounds of {config.training.local_epochs} local epochs {start} on "
        f"{config.images_per_user[0]}-{config.images_per_user[1]} photos per user, personal heads have had little "
        "data and time to learn each taste, and each device's test split is a few dozen photos (one photo moves "
        "its accuracy by several points). "
    )
    ahead = c["difference"] > 0 and c["fedper_last_rounds"] > c["fedavg_last_rounds"]
    if ahead and c["difference"] > 2 * c["standard_error"]:
        meaning = (
            f"FedPer's personal heads beat one global model by {100 * (fp - fa):.1f} points of mean device "
            "accuracy: users disagree about what makes a good photo, and a shared feature extractor with a "
            "personal head follows each user's taste, as in the FedPer paper's FLICKR-AES result. "
        )
    elif ahead:
        meaning = (
            f"FedPer is ahead of FedAvg ({fp:.3f} vs {fa:.3f}), as in the FedPer paper's FLICKR-AES result, but "
            f"not conclusively in this run: {budget}"
        )
    else:
        meaning = f"FedPer did not beat FedAvg in this run ({fp:.3f} vs {fa:.3f}): {budget}"
    meaning += evidence + _against_baselines(fp, results.get("baselines", {}))

    def img(name: str) -> str:
        data = base64.b64encode((out / name).read_bytes()).decode()
        return f'<img alt="{name}" src="data:image/png;base64,{data}">'

    rows = "".join(
        f"<tr><td>{html.escape(a)}</td><td>{r['final_mean_accuracy']:.3f}</td><td>{r['final_weighted_mean_accuracy']:.3f}</td>"
        f"<td>{r['final_std']:.3f}</td><td>{r['last5_mean_accuracy']:.3f}</td><td>{r['last5_std']:.3f}</td>"
        f"<td>{html.escape(r['final_point'])}</td></tr>"
        for a, r in algos.items()
    )
    rows += "".join(
        f"<tr><td>baseline: {html.escape(name)} <small>({html.escape(DESCRIPTIONS[name])})</small></td>"
        f"<td>{b['mean_accuracy']:.3f}</td><td></td><td>{b['std']:.3f}</td><td></td><td></td><td></td></tr>"
        for name, b in results.get("baselines", {}).items()
    )
    sizes = "".join(f"<tr><td>{html.escape(n)}</td><td>{s:,}</td></tr>" for n, s in demo["export"]["sizes"].items())
    new_users = _new_users_section(results.get("new_users"), img)
    rounds_done = {a: sum(not r.get("final") for r in results["rounds"][a]) for a in algos}
    traffic = ""
    for a, t in demo["traffic"].items():
        per = max(1, config.devices * rounds_done[a])
        traffic += (
            f"<tr><td>{a}</td><td>{t['down']:,}</td><td>{t['up']:,}</td>"
            f"<td>{t['down'] / per:,.0f}</td><td>{t['up'] / per:,.0f}</td></tr>"
        )
    timings = ", ".join(f"{html.escape(k)} {v:.0f} s" for k, v in demo["timings"].items())
    page = string.Template((Path(__file__).parent / "report_template.html").read_text())
    return page.substitute(
        meaning=html.escape(meaning),
        rows=rows,
        privacy=_privacy_section(results.get("privacy")) + _secure_section(config),
        accuracy_plot=img("accuracy_per_round.png"),
        client_plot=img("final_accuracy_per_client.png"),
        new_users=new_users,
        base=_base_section(demo["base"]),
        kp=config.kp,
        head=html.escape(config.head),
        devices=config.devices,
        images_per_user=f"{config.images_per_user[0]}-{config.images_per_user[1]}",
        engine=html.escape(config.runtime.engine),
        workers=config.workers or os.cpu_count(),
        rounds=config.rounds,
        local_epochs=config.training.local_epochs,
        learning_rate=config.training.learning_rate,
        momentum=config.training.momentum,
        batch_size=config.training.batch_size,
        seed=config.seed,
        environment=html.escape(_environment(results.get("environment"))),
        step_ms=f"{demo['step_ms']:.0f}",
        timings=timings,
        sizes=sizes,
        traffic=traffic,
    )


def _privacy_section(privacy: dict[str, Any] | None) -> str:
    """With --dp: what each fleet's server reported it spent (docs/PRIVACY.md)."""
    if not privacy:
        return ""

    def spent(p: dict[str, Any]) -> str:
        return "infinite (no noise)" if p["epsilon"] is None else format(p["epsilon"], ".3g")

    items = "".join(
        f"<li>{html.escape(a)}: epsilon {spent(p)} at delta {p['delta']:.3g} after {p['rounds']} noised rounds "
        f"(noise multiplier {p['noise_multiplier']:g}, each device drawn with probability "
        f"{p['sampling_probability']:g}, last clip norm {p['clip_norm']:.3g})</li>"
        for a, p in privacy.items()
    )
    return (
        "<h2>Privacy</h2><p>Both fleets ran DP-FedAvg: each device clipped its base delta, the server added "
        "Gaussian noise to their sum and published every round at its deadline; epsilon is what the server's "
        f"accountant (dp-accounting, RDP) reports at the end (docs/PRIVACY.md).</p><ul>{items}</ul>"
    )


def _secure_section(config: DemoConfig) -> str:
    """With --secagg: what the servers could see of each update (docs/SECAGG.md)."""
    secure = config.secure
    if not secure.secagg:
        return ""
    n = config.devices
    clip = "the round's DP clip norm" if config.privacy.dp else f"L2 norm {secure.secagg_clip:g}"
    return (
        "<h2>Secure aggregation</h2><p>Both fleets ran SecAgg+: in every round each device clipped its base "
        f"delta to {clip}, encoded it in fixed point with its weight (min(samples, "
        f"{1 if config.privacy.dp else secure.secagg_weight_cap})) and masked it with pairwise and self masks; "
        f"the server learned only the round's sum. With all {n} devices in a round, each shared its secrets with "
        f"k = {secure.neighbours(n)} others, any t = {secure.threshold(n)} of whom could "
        "recover them for the unmasking. The personal layers never left the devices either way. The traffic "
        "table includes the key, share and unmasking messages (docs/SECAGG.md).</p>"
    )


def _base_section(base: dict[str, Any]) -> str:
    """Where the server's version 0 came from, and what the pretrained base was taught."""
    compare_runs = (
        "<p>Pretrained against from scratch, FedPer against FedAvg over 3 seeds, and which cues the base carries: "
        "<code>make results</code> (its tables are in the project's docs). The same fleets from random weights: "
        "<code>fedper demo --init scratch</code>.</p>"
    )
    if base["kind"] == "scratch":
        return "<p>Random initial weights (<code>--init scratch</code>).</p>" + compare_runs
    text = f"<p>Checkpoint <code>{html.escape(base['path'])}</code>, sha256 <code>{base['sha256']}</code>; "
    if base["kind"] != "pretrained":
        return text + "the heads start fresh.</p>" + compare_runs
    card = base["card"]
    scores = card["pretext"]["held_out_scores"]
    looks = ", ".join(f"{k.removeprefix('look.')} {v:.2f}" for k, v in scores.items() if k.startswith("look."))
    data = card["data"]
    return (
        text + f"the base the toolkit ships, made by <code>fedper pretrain</code> at commit {card['commit'][:7]} "
        f"({card['training']['epochs']} epochs on {data['images']:,} unrated composites at {data['image_size']} px, "
        f"seed {card['training']['seed']}). Raters: {html.escape(data['raters'])}. It learned to tell what a photo "
        f"shows: held-out R² of the photographic properties: {html.escape(looks)}; content category accuracy "
        f"{scores['category_accuracy']:.2f} (chance 0.125). The heads start fresh.</p>" + compare_runs
    )


def _environment(env: dict[str, Any] | None) -> str:
    """What computed the floats, in words (fedper.environment)."""
    if not env:
        return "not recorded"
    return (f"{env['cpu']}, torch {env['torch']}, kernel set {env['cpu_capability']}, "
            f"{env['torch_threads']} thread(s) per worker")  # fmt: skip
