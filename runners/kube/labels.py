"""Which objects are servetune's, and whose: the labels every object a trial creates carries.

A controller finds, watches and deletes only objects whose labels carry *its own* controller id (and the study
and trial), listed by a label selector it built; a delete names an object the API listed under that selector
and carries the listed object's uid as a precondition, so an object of anyone else (or a later one of the same
name) is never touched. Values that are not valid label values (too long, other characters) are cut and given a
hash, so two different ids never share a label; the full values travel in annotations.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CONTROLLER", "MANAGED_BY", "STUDY", "TRIAL", "Owner", "label_value", "object_name"]

MANAGED_BY = "app.kubernetes.io/managed-by"
STUDY = "servetune.io/study"
TRIAL = "servetune.io/trial"
CONTROLLER = "servetune.io/controller"
ROLE = "servetune.io/role"
_FULL = "servetune.io/"
_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """``text`` as a label value: itself when valid, else its safe characters cut to 54 and 8 hex of its hash."""
    safe = _BAD.sub("-", text).strip("-_.")
    if safe == text and len(text) <= 63:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{safe[:54].rstrip('-_.')}-{digest}".lstrip("-")


def object_name(trial: int | str, token: str | None = None) -> str:
    """A fresh DNS-1035 name for a trial's objects: ``st-t<trial>-<random>`` (no guessing: the name is only ever
    used to address an object the API listed under the trial's selector)."""
    word = re.sub(r"[^a-z0-9]+", "-", str(trial).lower()).strip("-")[:20] or "x"
    return f"st-t{word}-{token or secrets.token_hex(3)}"


@dataclass(frozen=True)
class Owner:
    """Whose objects these are: the study, the trial and the controller (its lease id)."""

    study: str
    controller: str
    trial: str | None = None

    def labels(self) -> dict[str, str]:
        out = {MANAGED_BY: "servetune", STUDY: label_value(self.study), CONTROLLER: label_value(self.controller)}
        if self.trial is not None:
            out[TRIAL] = label_value(self.trial)
        return out

    def annotations(self) -> dict[str, str]:
        out = {f"{_FULL}study-name": self.study, f"{_FULL}controller-id": self.controller}
        if self.trial is not None:
            out[f"{_FULL}trial-number"] = self.trial
        return out

    def selector(self) -> str:
        """The label selector of exactly this owner's objects (the trial's, when a trial is set)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.labels().items()))

    def owns(self, labels: Mapping[str, str] | None) -> bool:
        """Do ``labels`` (an object's) carry every label of this owner? Checked again on each listed object before
        it is deleted: a server that ignores the selector must not make servetune delete someone else's object."""
        given = dict(labels or {})
        return all(given.get(k) == v for k, v in self.labels().items())
