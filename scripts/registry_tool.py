"""What scripts/image-verify.sh does to a registry by hand, through the OCI distribution API (standard library only).

  free-port                               a free TCP port on 127.0.0.1
  wait REGISTRY                           wait until http://REGISTRY/v2/ answers (30 s at most)
  digest REGISTRY REPO REF                the manifest digest REF resolves to (what the registry serves)
  derive REGISTRY REPO SRC DST [--label K=V] [--add-file PATH=TEXT]
                                          push a different image to DST: SRC's manifest with a changed config
                                          (a label) and/or one more layer (a file), reusing SRC's layers;
                                          prints the new manifest digest. Nothing signs it.
  copy-manifest REGISTRY REPO SRC DST     put SRC's manifest, unchanged, under tag DST (e.g. a sigstore
                                          signature, sha256-<hex>.sig, moved next to another manifest)
  forge-signature REGISTRY REPO SIG DIGEST
                                          rewrite the sigstore signature at tag SIG so its payload names DIGEST,
                                          keeping the original signature bytes, and put it at sha256-<hex of
                                          DIGEST>.sig: a signature that no longer matches its payload

The registry is plain HTTP on loopback (the one image-verify.sh starts), without authentication.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import socket
import sys
import tarfile
import time
import urllib.error
import urllib.request

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def request(method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
            ) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class Registry:
    def __init__(self, host: str, repo: str) -> None:
        self.base, self.repo = f"http://{host}/v2/{repo}", repo

    def manifest(self, ref: str) -> tuple[str, bytes]:
        status, headers, body = request("GET", f"{self.base}/manifests/{ref}", headers={"Accept": ", ".join(MANIFEST_TYPES)})
        if status != 200:
            raise SystemExit(f"registry_tool: GET manifest {self.repo}:{ref}: HTTP {status} {body[:200]!r}")
        return headers.get("Content-Type", json.loads(body).get("mediaType", "")), body

    def put_manifest(self, ref: str, media_type: str, body: bytes) -> str:
        status, headers, resp = request("PUT", f"{self.base}/manifests/{ref}", body, {"Content-Type": media_type})
        if status != 201:
            raise SystemExit(f"registry_tool: PUT manifest {self.repo}:{ref}: HTTP {status} {resp[:300]!r}")
        digest = headers.get("Docker-Content-Digest", sha256(body))
        assert digest == sha256(body), (digest, sha256(body))
        return digest

    def blob(self, digest: str) -> bytes:
        status, _, body = request("GET", f"{self.base}/blobs/{digest}")
        if status != 200 or sha256(body) != digest:
            raise SystemExit(f"registry_tool: GET blob {digest}: HTTP {status}")
        return body

    def put_blob(self, data: bytes) -> str:
        digest = sha256(data)
        status, headers, body = request("POST", f"{self.base}/blobs/uploads/", b"")
        if status != 202:
            raise SystemExit(f"registry_tool: start upload: HTTP {status} {body[:200]!r}")
        location = headers["Location"]
        if location.startswith("/"):
            location = self.base.split("/v2/")[0] + location
        sep = "&" if "?" in location else "?"
        status, _, body = request("PUT", f"{location}{sep}digest={digest}", data,
                                  {"Content-Type": "application/octet-stream"})
        if status != 201:
            raise SystemExit(f"registry_tool: upload {digest}: HTTP {status} {body[:200]!r}")
        return digest


def layer_with_file(path: str, text: str) -> tuple[bytes, str]:
    """A gzip'd tar layer holding one file; returns the blob and its diff_id (the digest of the tar)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = text.encode()
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    return gzip.compress(tar_bytes, mtime=0), sha256(tar_bytes)


def derive(reg: Registry, src: str, dst: str, labels: list[str], files: list[str]) -> str:
    media_type, body = reg.manifest(src)
    manifest = json.loads(body)
    config = json.loads(reg.blob(manifest["config"]["digest"]))
    for label in labels:
        key, _, value = label.partition("=")
        config.setdefault("config", {}).setdefault("Labels", {})
        config["config"]["Labels"] = {**(config["config"]["Labels"] or {}), key: value}
    for spec in files:
        path, _, text = spec.partition("=")
        blob, diff_id = layer_with_file(path, text)
        layer_type = OCI_LAYER_GZIP if "oci" in media_type else DOCKER_LAYER_GZIP
        manifest["layers"].append({"mediaType": layer_type, "digest": reg.put_blob(blob), "size": len(blob)})
        config["rootfs"]["diff_ids"].append(diff_id)
        config.setdefault("history", []).append({"created_by": f"registry_tool derive --add-file {path}"})
    config_bytes = json.dumps(config, separators=(",", ":")).encode()
    manifest["config"] = {**manifest["config"], "digest": reg.put_blob(config_bytes), "size": len(config_bytes)}
    return reg.put_manifest(dst, media_type, json.dumps(manifest, separators=(",", ":")).encode())


def forge_signature(reg: Registry, sig_tag: str, digest: str) -> str:
    media_type, body = reg.manifest(sig_tag)
    manifest = json.loads(body)
    old_layers = [layer["digest"] for layer in manifest["layers"]]
    for layer in manifest["layers"]:
        payload = json.loads(reg.blob(layer["digest"]))
        payload["critical"]["image"]["docker-manifest-digest"] = digest
        data = json.dumps(payload, separators=(",", ":")).encode()
        layer["digest"], layer["size"] = reg.put_blob(data), len(data)  # annotations (the signature) kept
    config = json.loads(reg.blob(manifest["config"]["digest"]))
    if config.get("rootfs", {}).get("diff_ids") == old_layers:
        config["rootfs"]["diff_ids"] = [layer["digest"] for layer in manifest["layers"]]
    config_bytes = json.dumps(config, separators=(",", ":")).encode()
    manifest["config"] = {**manifest["config"], "digest": reg.put_blob(config_bytes), "size": len(config_bytes)}
    return reg.put_manifest(sig_tag_for(digest), media_type, json.dumps(manifest, separators=(",", ":")).encode())


def sig_tag_for(digest: str) -> str:
    """Where sigstore attachments of a manifest live: tag sha256-<hex>.sig in the same repository."""
    algorithm, _, hexdigest = digest.partition(":")
    return f"{algorithm}-{hexdigest}.sig"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(host: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if request("GET", f"http://{host}/v2/")[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"registry_tool: no registry answered at http://{host}/v2/ within {timeout:.0f} s")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("free-port")
    sub.add_parser("wait").add_argument("registry")
    p = sub.add_parser("digest")
    p.add_argument("registry"), p.add_argument("repo"), p.add_argument("ref")
    p = sub.add_parser("derive")
    p.add_argument("registry"), p.add_argument("repo"), p.add_argument("src"), p.add_argument("dst")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--add-file", action="append", default=[], metavar="PATH=TEXT")
    p = sub.add_parser("copy-manifest")
    p.add_argument("registry"), p.add_argument("repo"), p.add_argument("src"), p.add_argument("dst")
    p = sub.add_parser("forge-signature")
    p.add_argument("registry"), p.add_argument("repo"), p.add_argument("sig"), p.add_argument("digest")
    sub.add_parser("sig-tag").add_argument("digest")
    args = ap.parse_args(argv)

    if args.cmd == "free-port":
        print(free_port())
    elif args.cmd == "wait":
        wait(args.registry)
    elif args.cmd == "sig-tag":
        print(sig_tag_for(args.digest))
    else:
        reg = Registry(args.registry, args.repo)
        if args.cmd == "digest":
            print(sha256(reg.manifest(args.ref)[1]))
        elif args.cmd == "derive":
            print(derive(reg, args.src, args.dst, args.label, args.add_file))
        elif args.cmd == "copy-manifest":
            media_type, body = reg.manifest(args.src)
            print(reg.put_manifest(args.dst, media_type, body))
        elif args.cmd == "forge-signature":
            print(forge_signature(reg, args.sig, args.digest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
