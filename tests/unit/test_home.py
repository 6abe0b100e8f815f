"""Where data lives: the Hugging Face cache found as huggingface_hub finds it, RAYFLEET_HOME."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rayfleet._home import hf_hub_cache, rayfleet_home

HF_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")

# Each case sets some of HF_VARIABLES (the others unset); the first set in this order wins.
CASES = [
    {"HF_HUB_CACHE": "/a/hub", "HUGGINGFACE_HUB_CACHE": "/b/hub", "HF_HOME": "/c"},
    {"HUGGINGFACE_HUB_CACHE": "/b/hub", "HF_HOME": "/c", "XDG_CACHE_HOME": "/x"},
    {"HF_HOME": "/c", "XDG_CACHE_HOME": "/x"},
    {"HF_HOME": "~/hf"},
    {"XDG_CACHE_HOME": "/x"},
    {},
]

# huggingface_hub reads its variables once, at import: reload it for every case.
PEER = f"""
import importlib, json, os, sys
import huggingface_hub.constants as constants
answers = []
for case in json.loads(sys.argv[1]):
    for name in {HF_VARIABLES!r}:
        os.environ.pop(name, None)
    os.environ.update(case)
    answers.append(importlib.reload(constants).HF_HUB_CACHE)
print(json.dumps(answers))
"""


def set_only(monkeypatch: pytest.MonkeyPatch, case: dict[str, str]) -> None:
    for name in HF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in case.items():
        monkeypatch.setenv(name, value)


def test_hub_cache_precedence_is_huggingface_hubs(monkeypatch):
    done = subprocess.run(
        [sys.executable, "-c", PEER, json.dumps(CASES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    expected = json.loads(done.stdout)
    ours = []
    for case in CASES:
        set_only(monkeypatch, case)
        ours.append(str(hf_hub_cache()))
    assert ours == expected


def test_hub_cache_precedence(monkeypatch, tmp_path):
    home = str(tmp_path)
    monkeypatch.setenv("HOME", home)
    expected = ["/a/hub", "/b/hub", "/c/hub", f"{home}/hf/hub", "/x/huggingface/hub"]
    for case, path in zip(CASES, expected, strict=False):
        set_only(monkeypatch, case)
        assert str(hf_hub_cache()) == path
    set_only(monkeypatch, {"HF_HUB_CACHE": "", "HF_HOME": "/c"})  # empty counts as unset
    assert str(hf_hub_cache()) == "/c/hub"
    set_only(monkeypatch, {})
    assert str(hf_hub_cache()) == f"{home}/.cache/huggingface/hub"


def test_rayfleet_home(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYFLEET_HOME", str(tmp_path / "home"))
    assert rayfleet_home() == tmp_path / "home"
    monkeypatch.delenv("RAYFLEET_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert rayfleet_home() == tmp_path / "cache" / "rayfleet"
