"""Sigstore (cosign) key pairs, image signatures and a containers policy check, for scripts/image-verify.sh.

  keygen DIR [--passphrase-file F] [--pem-type sigstore|cosign]
        a key pair in cosign's format: DIR/cosign.key, DIR/cosign.pub, DIR/cosign.password
  sign --key DIR --reference HOST/REPO:TAG IMAGE_DIR
        add a sigstore signature of IMAGE_DIR's manifest (a skopeo `dir:` copy) as its next signature-N
        file; `skopeo copy --preserve-digests dir:IMAGE_DIR docker://...` with a registries.d entry
        `use-sigstore-attachments: true` then stores it in the registry as cosign does
  verify --policy policy.json --reference HOST/REPO(:TAG|@DIGEST) IMAGE_DIR
        the decision a containers policy.json makes on that image (a skopeo `dir:` copy made with the same
        registries.d entry, so that its sigstore signatures came along); exit 0 accepted, 1 refused

Why this exists: Debian bookworm's skopeo 1.9.3 (and buildah and podman, through the same containers/image
5.23 package) is built with sigstore compiled out: `skopeo copy --sign-by-sigstore-private-key` and any
policy with a `sigstoreSigned` requirement fail with "Debian-local change: sigstore disabled", and it has no
`generate-sigstore-key`; cosign is not packaged in bookworm. It still reads and writes sigstore attachments
(the `sha256-<hex>.sig` tags beside an image). So skopeo moves the images and their signatures, and this
tool does the three steps that bookworm lacks, in the formats upstream uses, so that cosign
(`cosign verify --key cosign.pub`), sigstore's policy-controller (a `key:` authority) and a skopeo built
with sigstore (the same policy.json) read what it writes:

- keys (sigstore's cryptoutils, cosign generate-key-pair): ECDSA P-256, PKCS#8 DER encrypted by
  github.com/secure-systems-lab/go-securesystemslib/encrypted (formerly go-tuf's) and PEM-encoded as
  "ENCRYPTED SIGSTORE PRIVATE KEY" ("ENCRYPTED COSIGN PRIVATE KEY" with --pem-type cosign, for cosign v1 and
  older containers/image, which accept only that type). The encrypted body is the JSON
    {"kdf": {"name": "scrypt", "params": {"N": 32768, "r": 8, "p": 1}, "salt": b64(32 bytes)},
     "cipher": {"name": "nacl/secretbox", "nonce": b64(24 bytes)},
     "ciphertext": b64(secretbox.Seal(pkcs8_der, nonce, scrypt(passphrase, salt, N, r, p, 32)))}
  (Go's []byte is standard base64 with padding; the Go reader refuses other scrypt parameters). The public
  key is PEM "PUBLIC KEY" (PKIX).
- signatures (containers/image signature/sigstore, cosign's "simple signing" payload): the JSON
  {"critical": {"identity": {"docker-reference": REF}, "image": {"docker-manifest-digest": DIGEST},
                "type": "cosign container image signature"}, "optional": {...}}
  signed with ECDSA over SHA-256 (ASN.1 DER, base64) in the annotation dev.cosignproject.cosign/signature
  of a layer of type application/vnd.dev.cosign.simplesigning.v1+json. In a `dir:` copy, containers/image
  keeps a sigstore signature as a file "\\x00sigstore-json\\n" + {"mimeType", "payload", "annotations"}.
- the policy (containers-policy.json(5), what containers/image's policy_eval_sigstore.go decides): the
  most specific scope of the `docker` transport that matches the reference (HOST/REPO:TAG, HOST/REPO,
  its parent namespaces, HOST, the transport's "" scope, then `default`); every requirement must accept.
  Supported: insecureAcceptAnything, reject, and sigstoreSigned with keyPath or keyData and signedIdentity
  matchRepoDigestOrExact (the default), matchExact, matchRepository, exactReference, exactRepository. A
  sigstoreSigned requirement accepts if one signature verifies with the key, its payload names the
  manifest's digest and its identity matches. Anything else (fulcio, rekorPublicKey, signedBy, ...) is
  refused as unsupported rather than ignored.

Needs `cryptography` (keys, ECDSA) and PyNaCl (secretbox: XSalsa20-Poly1305, which `cryptography` does not
offer); scripts/image-verify.sh installs both into a small venv of its own, .cache/sigstore-keys-venv.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from nacl.secret import SecretBox

SCRYPT_N, SCRYPT_R, SCRYPT_P = 32768, 8, 1  # the only parameters the Go reader accepts (CheckParams)
SALT_SIZE, KEY_SIZE = 32, 32
PEM_TYPES = {"sigstore": "ENCRYPTED SIGSTORE PRIVATE KEY", "cosign": "ENCRYPTED COSIGN PRIVATE KEY"}
SIGNATURE_MIME_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNATURE_TYPE = "cosign container image signature"
BLOB_PREFIX = b"\x00sigstore-json\n"  # containers/image's serialization of a sigstore signature


class Refused(Exception):
    """The policy refuses the image; the message says why."""


# --- keys -------------------------------------------------------------------------------------------------------

def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _scrypt(passphrase: bytes, salt: bytes) -> bytes:
    # N * r * 128 bytes is 32 MiB: exactly OpenSSL's default cap, so give it room.
    return hashlib.scrypt(passphrase, salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=64 << 20, dklen=KEY_SIZE)


def encrypt(plaintext: bytes, passphrase: bytes) -> bytes:
    """go-securesystemslib's encrypted.Encrypt: the JSON document inside cosign's private key PEM block."""
    salt, nonce = secrets.token_bytes(SALT_SIZE), secrets.token_bytes(SecretBox.NONCE_SIZE)
    sealed = SecretBox(_scrypt(passphrase, salt)).encrypt(plaintext, nonce).ciphertext  # tag + ciphertext, as Go's
    return json.dumps({
        "kdf": {"name": "scrypt", "params": {"N": SCRYPT_N, "r": SCRYPT_R, "p": SCRYPT_P}, "salt": _b64(salt)},
        "cipher": {"name": "nacl/secretbox", "nonce": _b64(nonce)},
        "ciphertext": _b64(sealed),
    }, separators=(",", ":")).encode()


def decrypt(document: bytes, passphrase: bytes) -> bytes:
    """go-securesystemslib's encrypted.Decrypt, with its check of the scrypt parameters."""
    doc = json.loads(document)
    if doc["kdf"]["name"] != "scrypt" or doc["cipher"]["name"] != "nacl/secretbox":
        raise ValueError("encrypted: unknown kdf or cipher")
    if doc["kdf"]["params"] != {"N": SCRYPT_N, "r": SCRYPT_R, "p": SCRYPT_P}:
        raise ValueError("encrypted: unexpected kdf parameters")
    key = _scrypt(passphrase, base64.b64decode(doc["kdf"]["salt"]))
    return SecretBox(key).decrypt(base64.b64decode(doc["ciphertext"]), base64.b64decode(doc["cipher"]["nonce"]))


def pem(block_type: str, der: bytes) -> bytes:
    body = base64.b64encode(der).decode("ascii")
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return ("\n".join([f"-----BEGIN {block_type}-----", *lines, f"-----END {block_type}-----"]) + "\n").encode()


def unpem(data: bytes) -> tuple[str, bytes]:
    lines = data.decode("ascii").strip().splitlines()
    if not (lines and lines[0].startswith("-----BEGIN ") and lines[-1].startswith("-----END ")):
        raise ValueError("not a PEM block")
    return lines[0][len("-----BEGIN "):-len("-----")], base64.b64decode("".join(lines[1:-1]))


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def keygen(out: Path, passphrase: bytes, pem_type: str = "sigstore") -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    private = pem(PEM_TYPES[pem_type], encrypt(der, passphrase))
    if load_private_key(private, passphrase).private_numbers() != key.private_numbers():  # read back as Go will
        raise AssertionError("the key does not read back")
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "cosign.key", private, 0o600)
    _write(out / "cosign.pub", public, 0o644)
    _write(out / "cosign.password", passphrase, 0o600)


def load_private_key(data: bytes, passphrase: bytes) -> ec.EllipticCurvePrivateKey:
    block, body = unpem(data)
    if block not in PEM_TYPES.values():
        raise ValueError(f"unsupported pem type: {block}")
    key = serialization.load_der_private_key(decrypt(body, passphrase), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("not an ECDSA key")
    return key


# --- signatures -------------------------------------------------------------------------------------------------

def manifest_digest(manifest: bytes, algorithm: str = "sha256") -> str:
    return f"{algorithm}:{hashlib.new(algorithm, manifest).hexdigest()}"


def signature_files(image_dir: Path) -> list[Path]:
    """A `dir:` image's signatures in order: signature-1, signature-2, ..."""
    found, n = [], 1
    while (image_dir / f"signature-{n}").exists():
        found.append(image_dir / f"signature-{n}")
        n += 1
    return found


def sign(key_dir: Path, reference: str, image_dir: Path) -> Path:
    passphrase = (key_dir / "cosign.password").read_bytes().rstrip(b"\n")
    key = load_private_key((key_dir / "cosign.key").read_bytes(), passphrase)
    digest = manifest_digest((image_dir / "manifest.json").read_bytes())
    payload = json.dumps({  # what containers/image's NewUntrustedSigstorePayload marshals (Go sorts map keys)
        "critical": {"identity": {"docker-reference": reference}, "image": {"docker-manifest-digest": digest},
                     "type": SIGNATURE_TYPE},
        "optional": {"creator": "llmslo scripts/sigstore_tool.py", "timestamp": int(time.time())},
    }, sort_keys=True, separators=(",", ":")).encode()
    signature = key.sign(payload, ec.ECDSA(hashes.SHA256()))
    blob = BLOB_PREFIX + json.dumps({"mimeType": SIGNATURE_MIME_TYPE, "payload": _b64(payload),
                                     "annotations": {SIGNATURE_ANNOTATION: _b64(signature)}}).encode()
    path = image_dir / f"signature-{len(signature_files(image_dir)) + 1}"
    path.write_bytes(blob)
    return path


# --- references -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ref:
    """A fully qualified docker reference: HOST/PATH with a tag, a digest, both or neither."""

    name: str  # HOST/PATH
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Ref:
        rest, _, digest = text.partition("@")
        slash = rest.rfind("/")
        colon = rest.rfind(":")
        name, tag = (rest[:colon], rest[colon + 1:]) if colon > slash else (rest, None)
        first = name.split("/", 1)[0]
        if "/" not in name or not ("." in first or ":" in first or first == "localhost"):
            name = ("docker.io/" + name) if "/" in name else ("docker.io/library/" + name)
        if not re.fullmatch(r"[a-z0-9.\-:]+(/[a-z0-9._\-]+)+", name) or (digest and ":" not in digest):
            raise ValueError(f"invalid docker reference {text!r}")
        return cls(name, tag or None, digest or None)

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def scopes(self) -> list[str]:
        """containers/image's docker PolicyConfigurationIdentity, then its PolicyConfigurationNamespaces."""
        out = [str(Ref(self.name, None if self.digest else self.tag, self.digest))] if (self.tag or self.digest) else []
        parts = self.name.split("/")
        out += ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]
        return out


# --- the policy -------------------------------------------------------------------------------------------------

def requirements_for(policy: dict, ref: Ref) -> tuple[str, list[dict]]:
    scopes = policy.get("transports", {}).get("docker", {})
    for scope in [*ref.scopes(), ""]:
        if scope in scopes:
            return f"docker scope {scope!r}", scopes[scope]
    if "default" not in policy:
        raise Refused("the policy has no default")
    return "default", policy["default"]


def identity_matches(rule: dict, image: Ref, signed: Ref) -> bool:
    kind = rule.get("type", "matchRepoDigestOrExact")
    exact = (image.tag is not None or image.digest is not None) and str(image) == str(signed)
    if kind == "matchExact":
        return exact
    if kind == "matchRepoDigestOrExact":
        return image.name == signed.name if image.digest else exact
    if kind == "matchRepository":
        return image.name == signed.name
    if kind == "exactReference":
        return str(Ref.parse(rule["dockerReference"])) == str(signed)
    if kind == "exactRepository":
        return Ref.parse(rule["dockerRepository"]).name == signed.name
    raise Refused(f"signedIdentity type {kind!r} is not supported by this tool")


def _strict(obj: object, fields: set[str], what: str) -> dict:
    if not isinstance(obj, dict) or set(obj) != fields:
        raise Refused(f"invalid signature: {what} must have exactly the fields {sorted(fields)}")
    return obj


def check_signature(blob: bytes, manifest: bytes, public_key: ec.EllipticCurvePublicKey, image: Ref,
                    identity: dict) -> None:
    """One signature against one sigstoreSigned requirement, in containers/image's order; raises Refused."""
    if not blob.startswith(BLOB_PREFIX):
        raise Refused("not a sigstore signature")
    sig = json.loads(blob[len(BLOB_PREFIX):])
    if sig.get("mimeType") != SIGNATURE_MIME_TYPE:
        raise Refused(f"unexpected signature MIME type {sig.get('mimeType')!r}")
    b64 = (sig.get("annotations") or {}).get(SIGNATURE_ANNOTATION)
    if not b64:
        raise Refused(f"signature annotation {SIGNATURE_ANNOTATION} missing")
    payload = base64.b64decode(sig["payload"])
    try:
        public_key.verify(base64.b64decode(b64, validate=True), payload, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError) as e:
        raise Refused(f"cryptographic signature verification failed: {str(e) or 'invalid signature'}") from None
    doc = _strict(json.loads(payload), {"critical", "optional"}, "the payload")
    critical = _strict(doc["critical"], {"type", "image", "identity"}, "critical")
    if critical["type"] != SIGNATURE_TYPE:
        raise Refused(f"unrecognized signature type {critical['type']!r}")
    signed_digest = _strict(critical["image"], {"docker-manifest-digest"}, "critical.image")["docker-manifest-digest"]
    algorithm = signed_digest.partition(":")[0]
    if algorithm not in ("sha256", "sha512") or manifest_digest(manifest, algorithm) != signed_digest:
        raise Refused(f"Signature for docker-manifest-digest {signed_digest} does not match the manifest "
                      f"({manifest_digest(manifest)})")
    signed = Ref.parse(_strict(critical["identity"], {"docker-reference"}, "critical.identity")["docker-reference"])
    if not identity_matches(identity, image, signed):
        raise Refused(f"Signature for identity {signed} is not accepted for {image}")


def sigstore_signed(req: dict, policy_dir: Path, image: Ref, image_dir: Path) -> None:
    unsupported = sorted(set(req) - {"type", "keyPath", "keyData", "signedIdentity"})
    if unsupported:
        raise Refused(f"sigstoreSigned with {', '.join(unsupported)} is not supported by this tool")
    if ("keyPath" in req) == ("keyData" in req):
        raise Refused("sigstoreSigned needs exactly one of keyPath and keyData")
    key_pem = base64.b64decode(req["keyData"]) if "keyData" in req else (policy_dir / req["keyPath"]).read_bytes()
    public_key = serialization.load_pem_public_key(key_pem)
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise Refused("only ECDSA public keys are supported by this tool")
    manifest = (image_dir / "manifest.json").read_bytes()
    files = signature_files(image_dir)
    if not files:
        raise Refused("A signature was required, but no signature exists")
    reasons = []
    for path in files:
        try:
            check_signature(path.read_bytes(), manifest, public_key, image, req.get("signedIdentity", {}))
            return
        except Refused as e:
            reasons.append(str(e))
    raise Refused(reasons[0] if len(reasons) == 1 else "None of the signatures were accepted, reasons: "
                  + "; ".join(reasons))


def evaluate(policy_path: Path, reference: str, image_dir: Path) -> str:
    """Accepts (returns what accepted it) or raises Refused."""
    policy = json.loads(policy_path.read_text())
    image = Ref.parse(reference)
    where, requirements = requirements_for(policy, image)
    if not requirements:
        raise Refused(f"{where}: no requirements")
    for req in requirements:
        kind = req.get("type")
        if kind == "insecureAcceptAnything":
            continue
        if kind == "reject":
            raise Refused(f"Running image docker://{image} is rejected by policy ({where})")
        if kind == "sigstoreSigned":
            sigstore_signed(req, policy_path.parent, image, image_dir)
            continue
        raise Refused(f"{where}: requirement type {kind!r} is not supported by this tool")
    return where


# --- the command line -------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("keygen", help="a key pair in cosign's format")
    p.add_argument("dir", type=Path)
    p.add_argument("--passphrase-file", type=Path, help="default: 32 random bytes, hex")
    p.add_argument("--pem-type", choices=sorted(PEM_TYPES), default="sigstore")
    p = sub.add_parser("sign", help="add a sigstore signature to a skopeo dir: copy")
    p.add_argument("--key", type=Path, required=True, help="the directory keygen wrote")
    p.add_argument("--reference", required=True, help="the docker reference signed (HOST/REPO:TAG)")
    p.add_argument("image_dir", type=Path)
    p = sub.add_parser("verify", help="a containers policy.json's decision on a skopeo dir: copy")
    p.add_argument("--policy", type=Path, required=True)
    p.add_argument("--reference", required=True, help="the docker reference pulled (HOST/REPO:TAG or @DIGEST)")
    p.add_argument("image_dir", type=Path)
    args = ap.parse_args(argv)

    if args.cmd == "keygen":
        passphrase = (args.passphrase_file.read_bytes().rstrip(b"\n") if args.passphrase_file
                      else secrets.token_hex(32).encode())
        keygen(args.dir, passphrase, args.pem_type)
        print(f"sigstore_tool: wrote {args.dir}/cosign.key ({PEM_TYPES[args.pem_type]}), cosign.pub, "
              "cosign.password", file=sys.stderr)
    elif args.cmd == "sign":
        path = sign(args.key, args.reference, args.image_dir)
        print(f"sigstore_tool: signed {args.reference}@{manifest_digest((args.image_dir / 'manifest.json').read_bytes())}"
              f" ({path.name})", file=sys.stderr)
    else:
        try:
            where = evaluate(args.policy, args.reference, args.image_dir)
        except Refused as e:
            print(f"refused: {e}")
            return 1
        print(f"accepted ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
