import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management.base import BaseCommand, CommandError

from audit import inclusion, log, note, signing, witness


class Command(BaseCommand):
    help = (
        "Prove that the log's latest signed tree head extends a checkpoint you kept (a consistency proof, "
        "RFC 9162), as a witness does. Exits 1 when it does not: the log was rewritten or restored from an "
        "older backup. With --update, keep the new checkpoint in that file (cosigned with --witness-key)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "kept", type=Path, help="the checkpoint note you kept (made on first use with --update)"
        )
        parser.add_argument(
            "--public-key", metavar="PEM", help="the log's public key (default: the trusted one)"
        )
        parser.add_argument(
            "--update", action="store_true", help="keep the current checkpoint in KEPT if it holds"
        )
        parser.add_argument(
            "--witness-key", metavar="PEM", type=Path, help="an Ed25519 private key: cosign it"
        )
        parser.add_argument(
            "--witness-name", default="", help="the witness key's name (required with --witness-key)"
        )

    def handle(self, *args, **options):
        head = inclusion.latest_tree_head()
        if head is None:
            raise CommandError("the log has no signed tree head yet")
        kept_path: Path = options["kept"]
        kept = kept_path.read_text(encoding="utf-8") if kept_path.exists() else None
        if kept is None and not options["update"]:
            raise CommandError(
                f"{kept_path} does not exist (pass --update to keep the current checkpoint there)"
            )
        log_key = signing.trusted_public_key(options["public_key"])
        proof: list[bytes] = []
        if kept is not None:
            try:
                old_size = note.tree_head(note.split(kept)[0]).size
                if old_size <= head.body["tree"]["size"]:
                    proof = log.consistency(old_size, head.body["tree"]["size"])
            except (note.NoteError, log.LogError) as exc:
                raise CommandError(f"cannot prove consistency with {kept_path}: {exc}") from exc
        result = witness.check(kept=kept, current=head.note, proof=proof, log_key=log_key)
        if not result.consistent:
            self.stdout.write(result.sentence)
            raise SystemExit(1)
        self.stdout.write(f"checkpoint {head.number}: {result.sentence}")
        if options["update"]:
            current = head.note
            if options["witness_key"]:
                if not options["witness_name"]:
                    raise CommandError("--witness-key needs --witness-name")
                key = serialization.load_pem_private_key(options["witness_key"].read_bytes(), password=None)
                if not isinstance(key, Ed25519PrivateKey):
                    raise CommandError(f"{options['witness_key']} is not an Ed25519 private key")
                current = witness.cosign(
                    current, name=options["witness_name"], key=key, timestamp=int(time.time())
                )
            kept_path.parent.mkdir(parents=True, exist_ok=True)
            kept_path.write_text(current, encoding="utf-8")
            self.stdout.write(f"kept in {kept_path}")
