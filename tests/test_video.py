"""Where the sample videos are looked for (deltaconv.video.video_dirs, local_origin)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from deltaconv import video


def _git(*args: str) -> None:
    subprocess.run(["git", *args], check=True, capture_output=True)


@pytest.fixture
def checkout_and_clone(tmp_path):
    """A checkout at tmp/work/main with tmp/work/shared/videos beside it, and its clone at tmp/elsewhere/x."""
    main = tmp_path / "work" / "main"
    main.mkdir(parents=True)
    (tmp_path / "work" / "shared" / "videos").mkdir(parents=True)
    _git("init", "-q", str(main))
    _git("-C", str(main), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
    clone = tmp_path / "elsewhere" / "x"
    _git("clone", "-q", str(main), str(clone))
    return main, clone


def test_local_origin_of_a_clone(checkout_and_clone):
    main, clone = checkout_and_clone
    assert video.local_origin(clone) == main.resolve()
    assert video.local_origin(main) is None  # no origin


@pytest.mark.parametrize("url", ["file://{main}", "{main}/.", "../../work/main"])
def test_local_origin_url_forms(checkout_and_clone, url):
    main, clone = checkout_and_clone
    _git("-C", str(clone), "remote", "set-url", "origin", url.format(main=main))
    assert video.local_origin(clone) == main.resolve()


@pytest.mark.parametrize("url", ["https://example.invalid/deltaconv.git", "/no/such/folder", ""])
def test_local_origin_none_for_remote_or_missing_folders(checkout_and_clone, url):
    _, clone = checkout_and_clone
    _git("-C", str(clone), "remote", "set-url", "origin", url)
    assert video.local_origin(clone) is None


def test_local_origin_without_git(tmp_path):
    assert video.local_origin(tmp_path) is None
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("not [ a config")
    assert video.local_origin(tmp_path) is None


def test_video_dirs_order_and_origin(checkout_and_clone, monkeypatch, tmp_path):
    main, clone = checkout_and_clone
    monkeypatch.setenv("DELTACONV_VIDEOS", str(tmp_path / "env"))
    monkeypatch.setattr(video, "local_origin", lambda root: main.resolve())
    dirs = video.video_dirs()
    assert dirs[0] == tmp_path / "env"
    assert dirs[-1] == main.resolve().parent / "shared" / "videos"
    monkeypatch.delenv("DELTACONV_VIDEOS")
    monkeypatch.setattr(video, "local_origin", lambda root: None)
    assert tmp_path / "env" not in video.video_dirs()
    assert Path(video.__file__).resolve().parent.parent.parent / "shared" / "videos" in video.video_dirs()


def test_find_sample_video_in_the_origins_shared_folder(checkout_and_clone, monkeypatch):
    main, _ = checkout_and_clone
    (main.parent / "shared" / "videos" / "clip.mp4").write_bytes(b"")
    monkeypatch.delenv("DELTACONV_VIDEOS", raising=False)
    monkeypatch.setattr(video, "local_origin", lambda root: main.resolve())
    assert video.find_sample_video("clip.mp4") == main.resolve().parent / "shared" / "videos" / "clip.mp4"


def test_read_frames_crop():
    """``crop=(x, y, width, height)`` takes that region of each frame (before any resize); a bad crop is named."""
    import cv2

    from deltaconv.video import find_sample_video, read_frames, to_tensor

    cap = cv2.VideoCapture(str(find_sample_video()))
    cap.set(cv2.CAP_PROP_POS_FRAMES, 3)
    ok, frame = cap.read()
    cap.release()
    assert ok
    got = next(read_frames(max_frames=1, start=3, crop=(100, 50, 40, 30)))
    assert got.shape == (1, 3, 30, 40)
    torch.testing.assert_close(got, to_tensor(frame[50:80, 100:140]))
    with pytest.raises(ValueError, match=r"read_frames: crop must be .* got \(1, 2, 0, 4\)"):
        next(read_frames(max_frames=1, crop=(1, 2, 0, 4)))
    with pytest.raises(ValueError, match=r"read_frames: crop: the region \(x=760, y=0, width=9, height=4\) does "
                                         r"not lie inside the 768x576 \(width x height\) frame"):
        next(read_frames(max_frames=1, crop=(760, 0, 9, 4)))
