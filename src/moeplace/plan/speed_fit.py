"""Fitting the speed model (plan/speed.py) to measured runs: which coefficients the runs can tell apart, a
non-negative least-squares fit over them with the rest from the prior, the prior anchored on the ceilings probe's
own runs, and the out-of-sample checks (leave one run out; fit at one depth, predict the other)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import numpy as np
from scipy.optimize import nnls

from ..core.errors import MoeplaceError
from ..model.meta import ModelMeta
from .speed import FEATURES, MIN_SPREAD, TESTS, Run, SpeedModel, TestModel, features


def _free(test: str, rows: list[dict[str, float]]) -> list[str]:
    """The coefficients the runs can tell apart: the fixed time per layer and the host term (two n are enough),
    the KV term with two depths, the hop cost when some placement's hops are not proportional to its host
    bytes. Prefill's host term is the copy per ubatch (llama.cpp offloads a large batch's host experts to the
    device); at one ubatch it cannot be told from computing them on the host, so one stands for both."""

    def varies(key: str) -> bool:
        return len({round(r[key], 12) for r in rows}) > 1

    free = ["layers"]
    host = "host_gb" if test == "tg" else "link_gb"
    if varies(host):
        free.append(host)
    if varies("kv_gb"):
        free.append("kv_gb")
    if test == "tg" and varies("hops"):
        ratios = [r["hops"] / r["host_gb"] for r in rows if r["host_gb"] > 0]
        if ratios and max(ratios) > 1.1 * min(ratios):  # else hops are host bytes by another name
            free.append("hops")
    return free


def _nonnegative(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares of a @ x = y, the columns scaled alike first (features span 1e-3..1e2)."""
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1
    solution: np.ndarray = nnls(a / scale, y)[0] / scale
    return solution


def _tok_s(run: Run) -> float:
    """A measured run's speed: a fit takes measured runs only."""
    assert run.tok_s is not None
    return run.tok_s


# How much slower or faster than the ceilings probe a fit at one depth may find the device, and keep the probe's
# proportions (see _shares): this VM drifts by tens of percent between hours; 4x is two runs that disagree with it.
MAX_DRIFT = 4.0
# What a placement with experts on the host costs beyond their bytes: decode's hops, prefill's copy of them.
HOST_TERM = {"tg": "hops", "pp": "link_gb"}


def anchored(meta: ModelMeta, base: SpeedModel, anchors: list[Run]) -> SpeedModel:
    """The prior `base` with its fixed time per layer, and from runs at two placements also the host term of
    HOST_TERM, solved from the ceilings stage's own runs of the model (`anchors`, at one depth: every routed
    expert on the device and every one on the host): what no datasheet gives, measured on the device, and no run
    of a sweep. From the host placement alone decode gets the fixed time only (the hop stays the measured or
    default one); prefill needs both, its copy being most of what placement changes."""
    tests = dict(base.tests)
    for test, m in base.tests.items():
        mine = [r for r in anchors if r.test == test and r.tok_s]
        both = len({r.n_cpu_moe for r in mine}) > 1
        if not mine or (test == "pp" and not both):
            continue
        free = ["layers", HOST_TERM[test]] if both else ["layers"]
        coef = {k: m.coef.get(k, 0.0) for k in FEATURES[test]}
        rows = [features(meta, r) for r in mine]
        known = np.array([sum(coef[k] * x[k] for k in coef if k not in free) for x in rows])
        a = np.array([[x[k] for k in free] for x in rows])
        solution = _nonnegative(a, 1 / np.array([r.tok_s for r in mine]) - known)
        coef |= {k: float(v) for k, v in zip(free, solution)}
        # the anchors' times less the term: a cost measured too high leaves that much less fixed time
        fixed_lever = {k: -float(np.linalg.lstsq(a, np.array([x[k] for x in rows]), rcond=None)[0][0]) for k in m.se}
        tests[test] = replace(
            m,
            coef=coef,
            source={k: m.source.get(k, "default") for k in coef} | dict.fromkeys(free, "ceilings"),
            fixed_lever=fixed_lever,
        )
    return SpeedModel(tests)


def _shares(test: str, source: dict[str, str], prior_model: TestModel | None, free: list[str]) -> dict[str, float]:
    """Where a fit cannot tell the fixed time from the cost of depth (its runs are at one depth) and the ceilings
    stage measured the fixed time, the host term and the attention cost on this device (the fixed time from the
    probe's own runs): each coefficient the fit keeps from those measurements (`source`), per unit of the fixed
    time per layer; else nothing. The fit then scales them with the fixed time it finds rather than putting the
    whole difference from the prior on the fixed time: a shared host slows them all alike between the probe's
    hour and the sweep's, and at a deep fit a few percent of attention would be most of the fixed time (carried
    to a shallow depth, tens of percent off)."""
    if prior_model is None or "kv_gb" in free or "layers" not in free:
        return {}
    fixed = prior_model.coef.get("layers", 0.0)
    if fixed <= 0 or not all(prior_model.source.get(k) == "ceilings" for k in ("layers", "kv_gb", HOST_TERM[test])):
        return {}
    return {k: prior_model.coef[k] / fixed for k in FEATURES[test] if k not in free and source[k] == "ceilings"}


def fit(meta: ModelMeta, runs: list[Run], base: SpeedModel | None = None) -> SpeedModel:
    """Calibrate per test by non-negative least squares on time per token: the coefficients the runs can
    tell apart (see _free) are fitted, the others keep `base`'s (bandwidth priors; at one depth, those the ceilings
    probe measured scale with the fitted fixed time: see _shares) or are 0."""
    tests = {}
    for test in TESTS:
        mine = [r for r in runs if r.test == test and r.tok_s and r.tok_s > 0]
        if len({(r.n_cpu_moe, r.host_tensors, r.depth) for r in mine}) < 2:
            if base and test in base.tests:
                tests[test] = base.tests[test]
            continue
        tests[test] = _fit_test(meta, test, mine, base.tests.get(test) if base else None)
    if not tests:
        raise MoeplaceError(
            "calibration needs at least two successful runs of one test at different placements or depths."
        )
    return SpeedModel(tests)


def _fit_test(meta: ModelMeta, test: str, mine: list[Run], prior_model: TestModel | None) -> TestModel:
    """One test's model fitted to its runs `mine` (two placements or depths at least), the rest from
    `prior_model`, with the errors of the fitted coefficients and of the prior's they take up."""
    rows = [features(meta, r) for r in mine]
    y = np.array([1 / _tok_s(r) for r in mine])
    coef = {k: (prior_model.coef.get(k, 0.0) if prior_model else 0.0) for k in FEATURES[test]}
    source = {k: (prior_model.source.get(k, "default") if prior_model else "default") for k in FEATURES[test]}
    free = _free(test, rows)
    if test == "tg" and "host_gb" in free and "hops" not in free and len({r["hops"] for r in rows}) > 1:
        # hops are host bytes by another name here: the host term takes both, not a prior's hop as its floor
        coef["hops"], source["hops"] = 0.0, "fit (in host_gb)"
    # Where the fit's fixed time is no hour's drift from the probe's, its runs disagree with the probe: the
    # probe's values stand.
    for shares in (_shares(test, source, prior_model, free), {}):
        kept = {k: 0.0 if k in shares else v for k, v in coef.items()}  # the fixed time's column carries shares
        known = np.array([sum(kept[k] * row[k] for k in FEATURES[test] if k not in free) for row in rows])
        tied = [sum(w * row[k] for k, w in shares.items()) for row in rows]
        a = np.array([[row[k] + (t if k == "layers" else 0.0) for k in free] for row, t in zip(rows, tied)])
        solution = _nonnegative(a, y - known)
        drift = solution[free.index("layers")] / prior_model.coef["layers"] if shares and prior_model else 1.0
        if 1 / MAX_DRIFT <= drift <= MAX_DRIFT:
            break
    coef = kept
    for k, value in zip(free, solution):
        coef[k], source[k] = float(value), "fit"
    for k, w in shares.items():
        coef[k], source[k] = w * coef["layers"], "fit (in layers)"
    at_zero = [k for k, value in zip(free, solution) if value == 0]
    model = TestModel(coef, source, fitted=free, runs=len(y), at_zero=at_zero, shares=shares)
    if prior_model:
        _prior_errors(model, prior_model, rows, tied, a)
    _fit_errors(model, a, known + a @ solution, y)
    return model


def _prior_errors(
    model: TestModel, prior_model: TestModel, rows: list[dict[str, float]], tied: list[float], a: np.ndarray
) -> None:
    """Each prior term's error (its sd) that the fit's free coefficients take up: how they move per unit of it
    (model.lever, by least squares on design `a`), the fixed time's share `tied` of each run moving too."""
    for k, sd in prior_model.se.items():
        if k not in model.fitted:  # a prior term's error, taken up by the coefficients the runs leave free
            # with shares, the error moves them all: its own, and every one through the probe's fixed time
            move = prior_model.fixed_lever.get(k, 0.0)
            moved = [row[k] - move * t for row, t in zip(rows, tied)]
            lever = np.linalg.lstsq(a, np.array(moved), rcond=None)[0]
            if model.shares:  # in units of the shares, which the fit scaled by this much
                sd *= model.coef["layers"] / prior_model.coef["layers"]
                model.fixed_lever[k] = move
            model.se[k], model.lever[k] = sd, lever.tolist()


def _fit_errors(model: TestModel, a: np.ndarray, predicted: np.ndarray, y: np.ndarray) -> None:
    """The fitted coefficients' covariance and standard errors, and the spread of a prediction, from the residuals
    of `predicted` against the runs' seconds per token `y` (none where the runs leave no degree of freedom)."""
    dof = len(y) - len(model.fitted)
    if dof > 0:
        rel = (predicted - y) / y
        sigma2 = float(((predicted - y) ** 2).sum() / dof)
        cov = sigma2 * np.linalg.pinv(a.T @ a)
        model.cov = cov.tolist()
        model.se |= {k: float(math.sqrt(max(cov[i, i], 0))) for i, k in enumerate(model.fitted)}
        model.spread = max(MIN_SPREAD, float(statistics.pstdev(rel) * math.sqrt(len(y) / dof)))


def leave_one_out(meta: ModelMeta, runs: list[Run], base: SpeedModel | None) -> list[dict[str, float] | None]:
    """Each run predicted by a model fitted to all the others (None where they cannot calibrate its test: a
    prediction from the bandwidth priors alone is not what this measures)."""
    out: list[dict[str, float] | None] = []
    for i, run in enumerate(runs):
        others = [r for j, r in enumerate(runs) if j != i]
        try:
            model = fit(meta, others, base)
        except MoeplaceError:
            out.append(None)
            continue
        fitted = model.tests.get(run.test)
        out.append(model.predict(meta, run) if fitted and fitted.fitted else None)  # priors alone are no fit
    return out


def two_point(meta: ModelMeta, runs: list[Run], depth: int, base: SpeedModel | None) -> tuple[SpeedModel, set[int]]:
    """The model fitted to the lowest and the highest n measured at one depth (per test), and those runs'
    indices: what a user with two runs has."""
    chosen: set[int] = set()
    for test in TESTS:
        at = [i for i, r in enumerate(runs) if r.test == test and r.depth == depth and not r.host_tensors]
        if len({runs[i].n_cpu_moe for i in at}) >= 2:
            chosen.add(min(at, key=lambda i: runs[i].n_cpu_moe))
            chosen.add(max(at, key=lambda i: runs[i].n_cpu_moe))
    return fit(meta, [runs[i] for i in sorted(chosen)], base), chosen
