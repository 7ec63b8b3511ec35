"""``capsmed fetch``: downloads from a loopback HTTP server with Range support."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import socket
import threading

import numpy as np
import pytest
from typer.testing import CliRunner

from capsmed.cli import app
from capsmed.data.fetch import RemoteDataset, fetch_dataset
from capsmed.data.sources.mnist.idx import encode_idx, read_idx_images
from capsmed.data.sources.mnist.reader import REMOTE
from capsmed.errors import CapsmedError
from tests.helpers import assert_clean_failure

runner = CliRunner()
NAMES = list(REMOTE["mnist"].md5)


class _Server:
    """A loopback HTTP server for ``files``; records every request's path and Range."""

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.requests: list[tuple[str, str | None]] = []
        self.honour_range = True
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                name = self.path.rsplit("/", 1)[-1]
                owner.requests.append((self.path, self.headers.get("Range")))
                body = owner.files.get(name)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                spec = self.headers.get("Range")
                if spec and owner.honour_range:
                    start = int(spec.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range",
                                     f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:])

            def log_message(self, *args):  # keep test output clean
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/data/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _fake_files():
    """Small gzipped IDX files under the official names (not the real content)."""
    rng = np.random.default_rng(0)
    out = {}
    for name in NAMES:
        array = (rng.integers(0, 256, (50, 28, 28), dtype=np.uint8) if "images" in name
                 else rng.integers(0, 10, 50, dtype=np.uint8))
        out[name] = gzip.compress(encode_idx(array), mtime=0)
    return out


def _dataset(files, mirrors):
    md5 = {n: hashlib.md5(b, usedforsecurity=False).hexdigest() for n, b in files.items()}
    return RemoteDataset(name="test-mnist", mirrors=tuple(mirrors), md5=md5,
                         homepage="http://example.invalid/mnist/")


def _closed_port_url():
    with socket.socket() as s:  # bind, note the port, close: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


@pytest.fixture
def served():
    files = _fake_files()
    with _Server(files) as server:
        yield server, files


def test_downloads_verifies_and_skips_good_files(tmp_path, served):
    server, files = served
    paths = fetch_dataset(_dataset(files, [server.url]), tmp_path / "raw")
    assert [p.name for p in paths] == NAMES
    for p in paths:
        assert p.read_bytes() == files[p.name]
    assert read_idx_images(paths[0]).shape == (50, 28, 28)
    assert not list((tmp_path / "raw").glob("*.part"))
    assert len(server.requests) == 4 and all(r is None for _, r in server.requests)
    fetch_dataset(_dataset(files, [server.url]), tmp_path / "raw")
    assert len(server.requests) == 4  # nothing downloaded again


def test_resumes_a_partial_download_with_range(tmp_path, served):
    server, files = served
    dest = tmp_path / "raw"
    dest.mkdir()
    name = NAMES[0]
    half = len(files[name]) // 2
    (dest / f"{name}.part").write_bytes(files[name][:half])
    fetch_dataset(_dataset(files, [server.url]), dest)
    assert (dest / name).read_bytes() == files[name]
    assert not (dest / f"{name}.part").exists()
    ranges = {path.rsplit("/", 1)[-1]: r for path, r in server.requests}
    assert ranges[name] == f"bytes={half}-"
    assert ranges[NAMES[1]] is None


def test_restarts_when_the_server_ignores_range(tmp_path, served):
    server, files = served
    server.honour_range = False
    dest = tmp_path / "raw"
    dest.mkdir()
    (dest / f"{NAMES[2]}.part").write_bytes(b"stale bytes from elsewhere")
    fetch_dataset(_dataset(files, [server.url]), dest)
    assert (dest / NAMES[2]).read_bytes() == files[NAMES[2]]


def test_stale_part_file_is_restarted_once(tmp_path, served):
    server, files = served
    dest = tmp_path / "raw"
    dest.mkdir()
    name = NAMES[0]
    (dest / f"{name}.part").write_bytes(b"x" * 40)  # a partial download of another file
    fetch_dataset(_dataset(files, [server.url]), dest)
    assert (dest / name).read_bytes() == files[name]
    tries = [r for path, r in server.requests if path.endswith(name)]
    assert tries == ["bytes=40-", None]  # resumed, failed its checksum, started afresh


def test_complete_part_file_is_finished_after_416(tmp_path, served):
    server, files = served
    dest = tmp_path / "raw"
    dest.mkdir()
    (dest / f"{NAMES[1]}.part").write_bytes(files[NAMES[1]])
    fetch_dataset(_dataset(files, [server.url]), dest)
    assert (dest / NAMES[1]).read_bytes() == files[NAMES[1]]


def test_bad_existing_file_is_downloaded_again(tmp_path, served):
    server, files = served
    dest = tmp_path / "raw"
    dest.mkdir()
    (dest / NAMES[3]).write_bytes(b"not the file")
    fetch_dataset(_dataset(files, [server.url]), dest)
    assert (dest / NAMES[3]).read_bytes() == files[NAMES[3]]


def test_checksum_mismatch_leaves_no_file(tmp_path, served):
    server, files = served
    dataset = _dataset(files, [server.url])
    wrong = dict(dataset.md5, **{NAMES[1]: "0" * 32})
    dest = tmp_path / "raw"
    with pytest.raises(CapsmedError) as err:
        fetch_dataset(RemoteDataset("test-mnist", dataset.mirrors, wrong), dest)
    message = str(err.value)
    assert f"{dest / NAMES[1]}: cannot fetch test-mnist file" in message
    assert f"checksum mismatch (md5 {dataset.md5[NAMES[1]]}, expected {'0' * 32})" in message
    assert "\n" not in message
    assert (dest / NAMES[0]).exists()  # the good file before it is kept
    assert not (dest / NAMES[1]).exists() and not (dest / f"{NAMES[1]}.part").exists()


def test_falls_back_to_the_next_mirror(tmp_path, served):
    server, files = served
    broken = server.url.replace("/data/", "/missing/")
    del server.files[NAMES[0]]
    with _Server(files) as good:
        fetch_dataset(_dataset(files, [server.url, good.url]), tmp_path / "raw")
    assert (tmp_path / "raw" / NAMES[0]).read_bytes() == files[NAMES[0]]
    with pytest.raises(CapsmedError, match=r"HTTP 404"):
        fetch_dataset(_dataset(files, [broken]), tmp_path / "other")


def test_offline_message_says_how_to_place_files(tmp_path):
    dest = tmp_path / "raw"
    with pytest.raises(CapsmedError) as err:
        fetch_dataset(_dataset(_fake_files(), [_closed_port_url()]), dest, timeout=5)
    message = str(err.value)
    assert "connection refused" in message
    assert f"put them in {dest}/" in message
    assert all(name in message for name in NAMES)
    assert not dest.exists()  # made for the download, and nothing came: removed
    dest.mkdir()  # the user's own folder stays
    with pytest.raises(CapsmedError):
        fetch_dataset(_dataset(_fake_files(), [_closed_port_url()]), dest, timeout=5)
    assert dest.is_dir() and not list(dest.iterdir())


def test_cli_real_checksums_reject_other_files(tmp_path, served):
    server, _ = served
    dest = tmp_path / "raw"
    result = runner.invoke(app, ["-q", "fetch", "mnist", str(dest), "--mirror", server.url])
    victim = dest / NAMES[0]
    assert_clean_failure(result, str(victim), victim)
    assert f"expected {REMOTE['mnist'].md5[NAMES[0]]}" in result.stderr
    assert not dest.exists()


def test_cli_offline(tmp_path):
    dest = tmp_path / "raw"
    result = runner.invoke(app, ["-q", "fetch", "fashion-mnist", str(dest), "--mirror",
                                 _closed_port_url(), "--timeout", "5"])
    victim = dest / NAMES[0]
    assert_clean_failure(result, str(victim), victim)
    assert "connection refused" in result.stderr
    assert "zalandoresearch/fashion-mnist by hand" in result.stderr


def test_a_mirror_that_is_not_a_url_or_a_bad_timeout_is_refused_before_anything(tmp_path):
    for args, message in ((["--mirror", "notaurl"], "--mirror notaurl: not a URL"),
                          (["--timeout", "0"], "--timeout must be > 0 seconds"),
                          # inf failed in the socket with a traceback
                          (["--timeout", "inf"], "--timeout must be > 0 seconds"),
                          (["--timeout", "nan"], "--timeout must be > 0 seconds")):
        result = runner.invoke(app, ["fetch", "mnist", str(tmp_path / "m"), *args])
        assert_clean_failure(result, message)
        assert not (tmp_path / "m").exists()
