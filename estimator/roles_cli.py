"""`vram-estimate` with every role: reward / reference / value models, their placement, and vLLM's own settings.

Takes every `vram-estimate` flag plus the settings RunConfig does not carry yet (until the lead's schema adds
them as fields), and prints the policy report, the per-GPU layout (layout.py), vLLM's own accounting, and advice
that sees the whole training GPU. Run: `python -m estimator.roles_cli --model 1.5B --value-model 1.5B ...`.
"""

from __future__ import annotations

import argparse
import sys

from estimator import cli
from estimator.layout import PLACEMENTS, SLEEP_LEVELS, Role, VllmSettings

PROG = cli.PROG


def _role(kind: str):
    """'MODEL', 'MODEL@policy' or 'MODEL@own[=GROUP][:N]' -> Role (one line naming the bad value otherwise)."""

    def parse(value: str) -> Role:
        model, _, where = value.partition("@")
        place, _, n = (where or "policy").partition(":")
        place, _, group = place.partition("=")
        if not model or place not in PLACEMENTS or (n and not (n.isdigit() and int(n) >= 1)):
            raise argparse.ArgumentTypeError(
                f"invalid --{kind}-model {value!r}; accepted: MODEL, MODEL@policy, MODEL@own, MODEL@own=GROUP, "
                "MODEL@own:N (N >= 1)"
            )
        return Role(kind, model, place, int(n) if n else 1, group)

    return parse


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"invalid value {value!r}; accepted: an integer >= 1")
    return int(value)


def _share(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"invalid share {value!r}; accepted: a number in (0, 1]")
    return x


def role_parser() -> argparse.ArgumentParser:
    p = cli._Parser(prog=PROG, add_help=False)
    for kind, what in (
        ("reward", "a reward model (sequence classification) scoring every completion; repeatable"),
        ("reference", "a separate frozen reference model (OpenRLHF-style; TRL's own is --beta)"),
        ("value", "a PPO value model (critic) trained beside the policy"),
    ):
        p.add_argument(
            f"--{kind}-model",
            type=_role(kind),
            action="append",
            default=[],
            metavar="MODEL[@own[=GROUP][:N]]",
            help=f"{what}; @own[:N] puts it on N GPUs of its own (default: on the policy's GPUs)",
        )
    p.add_argument(
        "--vllm-max-model-length",
        type=_positive,
        metavar="N",
        help="TRL vllm_max_model_length / ms-swift vllm_max_model_len (default: the model's context)",
    )
    p.add_argument("--vllm-tensor-parallel-size", type=_positive, default=1, metavar="N")
    p.add_argument(
        "--vllm-sleep-level",
        type=int,
        choices=SLEEP_LEVELS,
        metavar="{0,1,2}",
        help="sleep level (TRL 1.16 uses 2 with --vllm-enable-sleep-mode; ms-swift sleep_level)",
    )
    p.add_argument(
        "--vllm-share-base",
        action="store_true",
        default=False,
        help="vLLM loads only the LoRA weights and shares the trainer's base (Unsloth fast_inference)",
    )
    p.add_argument(
        "--vllm-starts-first",
        action="store_true",
        default=False,
        help="colocate: vLLM reserves its share before the models load (OpenRLHF / Open-Reasoner-Zero)",
    )
    p.add_argument(
        "--vllm-server-gpus", type=_positive, default=1, metavar="N", help="GPUs running trl vllm-serve"
    )
    p.add_argument(
        "--vllm-server-utilization",
        type=_share,
        default=0.9,
        metavar="X",
        help="trl vllm-serve --gpu_memory_utilization (default: 0.9)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """The policy report plus the layout of every role; exit 0 fits, 1 does not, 2 bad input."""
    from estimator import advice as adv
    from estimator import catalog, layout_report, report
    from estimator.estimate import estimate
    from estimator.layout import plan, with_roles
    from estimator.units import GIB

    argv = sys.argv[1:] if argv is None else argv
    try:
        extra, rest = role_parser().parse_known_args(argv)
        if extra.vllm_sleep_level:
            rest = [*rest, "--vllm-enable-sleep-mode"]
        req = cli.parse(rest)
    except cli.UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    roles: list[Role] = extra.reward_model + extra.reference_model + extra.value_model
    settings = VllmSettings(
        max_model_length=extra.vllm_max_model_length,
        tensor_parallel_size=extra.vllm_tensor_parallel_size,
        sleep_level=extra.vllm_sleep_level if extra.vllm_sleep_level is not None else 2,
        share_base=extra.vllm_share_base,
        server_gpus=extra.vllm_server_gpus,
        server_utilization=extra.vllm_server_utilization,
        starts_first=extra.vllm_starts_first,
    )
    try:
        for r in roles:
            catalog.resolve_model(r.model)
    except (catalog.UnknownModel, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    for note in req.notes:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    est_fn = with_roles(lambda c, a: estimate(c, a), roles, catalog.resolve_model)
    est = est_fn(req.cfg, req.arch)
    total = req.gpu.memory_bytes if req.gpu is not None else int((req.cfg.gpu_memory_gib or 80.0) * GIB)
    lay = plan(
        estimate(req.cfg, req.arch),
        roles,
        settings,
        catalog.resolve_model,
        total,
        lambda c, a: estimate(c, a),
    )
    if req.as_json:
        import dataclasses
        import json

        d = report.to_json(est, [], report.check_fit(est, req.gpu) if req.gpu else None)
        d["layout"] = {
            "source": "estimated",
            "total_gpus": lay.total_gpus,
            "fits": lay.fits,
            **dataclasses.asdict(lay),
        }
        d["layout"]["fixes"] = adv.layout_fixes(lay, req.cfg) + adv.role_moves(lay)
        print(json.dumps(d, indent=2))
        return 0 if lay.fits else 1
    parts = [
        report.render(est, [], report.check_fit(est, req.gpu) if req.gpu else None),
        layout_report.render(lay),
    ]
    fixes = adv.layout_fixes(lay, req.cfg) + adv.role_moves(lay)
    if fixes:
        parts.append("what fixes the cause (estimated):\n" + "\n".join(f"  - {f}" for f in fixes))
    if req.advice or not lay.fits:
        starts = lay.vllm is None or lay.vllm.failure is None or "start-up" not in lay.vllm.failure
        budget = total if (req.gpu is not None or not lay.fits) and starts else None
        if not starts:
            parts.append(
                "(vLLM fails before the first step: the changes below save memory but do not fix that)"
            )
        parts.append(layout_report.render_advice(adv.advise(req.cfg, req.arch, est_fn, budget)))
    if req.solve:
        from estimator.solve import solve

        parts.append(report.render_solution(solve(req.cfg, req.arch, req.solve, total, est_fn)))
    print("\n".join(parts))
    return 0 if lay.fits else 1


if __name__ == "__main__":
    sys.exit(main())
