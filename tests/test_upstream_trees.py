"""The real ComfyUI trees the suite names are the ones it says: the users' release and the newest.

v0.30.0 is the release tag the seed user runs (their 0.30.2 has its MiniMax-H3 file byte for
byte, sha256 882c280b...); v0.33.0 the newest release at hand. The comfy-kitchen each pins is
what the suites that run them install (harness.COMFYUI_*_KITCHEN).
"""

import hashlib

import harness


def test_the_pins_the_suites_use_are_the_trees_own():
    assert harness.comfyui_kitchen(harness.COMFYUI_USER) == harness.COMFYUI_USER_KITCHEN
    assert harness.comfyui_kitchen(harness.COMFYUI_NEWEST) == harness.COMFYUI_NEWEST_KITCHEN
    assert harness.COMFYUI_NEWEST == "v0.33.0" and harness.COMFYUI_NEWEST == harness.COMFYUI_VERSIONS[-1]


def test_the_users_release_has_the_users_minimax_h3():
    tree = harness.comfyui_dir(harness.COMFYUI_USER)
    digest = hashlib.sha256((tree / "comfy" / "ldm" / "minimax" / "model.py").read_bytes()).hexdigest()
    assert digest.startswith("882c280b"), digest
    assert '__version__ = "0.30.0"' in (tree / "comfyui_version.py").read_text()
    assert '__version__ = "0.33.0"' in (harness.comfyui_dir(harness.COMFYUI_NEWEST) / "comfyui_version.py").read_text()
