"""Models beside the policy, as the run settings name them: `MODEL[@policy|@own[=GROUP][:N]]` -> Role.

`RunConfig.reward_models`, `reference_models` and `value_model` hold these strings; `config_roles(cfg)` turns them
into Roles for `estimator/plan/layout.py`, and `estimator/settings/validate.py` refuses a malformed one in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from estimator.text import shown

ROLE_KINDS = ("reward", "reference", "value")
PLACEMENTS = ("policy", "own")
MAX_ROLE_GPUS = 65536  # as --gpus (RunConfig.num_gpus)
# Models beside the policy, all kinds together. A GRPO or PPO run names a handful (a few reward models, a
# reference, a critic); 64 is far past any real setup, and keeps advice and --solve, which size every role for
# each of the hundreds of candidate runs they try, quick.
MAX_ROLES = 64
FORMS = (
    "MODEL, MODEL@policy, MODEL@own, MODEL@own=GROUP, MODEL@own:N, MODEL@own=GROUP:N "
    f"(N from 1 to {MAX_ROLE_GPUS})"
)


@dataclass(frozen=True)
class Role:
    """A model beside the policy: its kind, its model (catalog name, HF id or config.json) and where it lives."""

    kind: str
    model: str
    placement: str = "policy"  # "policy" = on the training GPUs; "own" = on `gpus` GPUs of its own
    gpus: int = 1
    group: str = ""  # roles placed "own" with the same group share their GPUs (e.g. a sampling process)
    sized: bool = field(default=False, compare=False)  # the spec gave `:N` (else `gpus` is the default 1)


class RoleSpecError(ValueError):
    """A role string that does not read as MODEL[@own[=GROUP][:N]] (one line naming the accepted forms)."""


def parse_role(kind: str, spec: str) -> Role:
    """'1.5B' -> Role(kind, '1.5B'); '1.5B@own=sampler:2' -> on 2 GPUs of its own shared with group 'sampler'."""
    model, _, where = spec.strip().partition("@")
    place, _, n = (where or "policy").partition(":")
    place, eq, group = place.partition("=")
    # ASCII digits only: str.isdigit() also holds for '²' and '①', which int() refuses.
    bad_n = bool(n) and not (n.isascii() and n.isdigit() and len(n) <= 6 and 1 <= int(n) <= MAX_ROLE_GPUS)
    bad_group = bool(eq) and not group.strip()  # `@own=` names no group
    if not model or place not in PLACEMENTS or bad_n or bad_group or (place == "policy" and (group or n)):
        raise RoleSpecError(f"{shown(spec, 80)} is not a role; accepted: {FORMS}")
    return Role(kind, model, place, int(n) if n else 1, group, sized=bool(n))


def group_size_conflict(roles: list[Role]) -> tuple[str, Role, Role] | None:
    """(group, first role, second role) where two roles of one `=GROUP` give different `:N`, else None: a group
    is one set of GPUs, so its roles may each give its size or leave it out, but not disagree."""
    first: dict[str, Role] = {}
    for r in roles:
        if r.placement != "own" or not r.group or not r.sized:
            continue
        seen = first.setdefault(r.group, r)
        if seen.gpus != r.gpus:
            return r.group, seen, r
    return None


def config_roles(cfg) -> list[Role]:
    """Every role a RunConfig names: reward models, then reference models, then the value model."""
    specs = [("reward", s) for s in cfg.reward_models or ()]
    specs += [("reference", s) for s in cfg.reference_models or ()]
    specs += [("value", cfg.value_model)] if cfg.value_model else []
    return [parse_role(kind, spec) for kind, spec in specs]
