import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.core.management.base import BaseCommand, CommandError

from audit import inclusion, log, note, signing, witness
from audit.models import GLOBAL_CHAIN
from audit.verify import Problem, verify


class Command(BaseCommand):
    help = (
        "Recompute every audit chain, check it against every signed checkpoint file (the trust anchor "
        "outside the database), check seals and purges, and compare the run rows with their events. "
        "Prints 'intact up to event N' or names the first altered, missing or reordered event; exits 1 "
        "when the record is not intact."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")
        parser.add_argument(
            "--chain",
            action="append",
            help="one run's proof: this chain only, read through indexes (repeatable)",
        )
        parser.add_argument(
            "--checkpoints",
            metavar="DIR",
            help="the signed checkpoint files to trust (default AUDIT_CHECKPOINT_DIR)",
        )
        parser.add_argument(
            "--public-key",
            metavar="PEM",
            help="the public key the checkpoints must verify with (default AUDIT_PUBLIC_KEY_FILE, else the signing key's)",
        )

        parser.add_argument(
            "--witnessed",
            metavar="NOTE",
            type=Path,
            help="require this checkpoint note's cosignature by the witness (--witness-key, --witness-name), "
            "and that the log extends it",
        )
        parser.add_argument("--witness-key", metavar="PEM", type=Path, help="the witness's public key")
        parser.add_argument("--witness-name", default="", help="the witness key's name")

    def handle(self, *args, **options):
        report = verify(
            chains=options["chain"], checkpoint_dir=options["checkpoints"], public_key=options["public_key"]
        )
        if options["witnessed"]:
            report.problems.extend(self._witness_problems(options))
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "intact": report.intact,
                        "events": report.events,
                        "chains": report.chains,
                        "last_event_id": report.last_event_id,
                        "checkpoint_id": report.checkpoint_id,
                        "checkpoint_number": report.checkpoint_number,
                        "checkpoints_checked": report.checkpoints_checked,
                        "anchor": report.anchor,
                        "problems": [p.__dict__ for p in report.problems],
                    }
                )
            )
        else:
            for problem in report.problems:
                self.stderr.write(problem.sentence())
            self.stdout.write(report.summary())
        if not report.intact:
            raise SystemExit(1)

    def _witness_problems(self, options):
        """The witness's cosignature on the note it kept, and that the log's latest tree head extends it."""
        if not options["witness_key"] or not options["witness_name"]:
            raise CommandError("--witnessed needs --witness-key and --witness-name")
        key = serialization.load_pem_public_key(options["witness_key"].read_bytes())
        if not isinstance(key, Ed25519PublicKey):
            raise CommandError(f"{options['witness_key']} is not an Ed25519 public key")
        kept = options["witnessed"].read_text(encoding="utf-8")
        name = options["witness_name"]
        try:
            note.cosigned_at(kept, name, key)
        except note.NoteError as exc:
            yield Problem("witness", None, GLOBAL_CHAIN, None, f"{options['witnessed']}: {exc}")
            return
        head = inclusion.latest_tree_head()
        if head is None:
            yield Problem("witness", None, GLOBAL_CHAIN, None, "the log has no signed tree head to compare")
            return
        try:
            old_size = note.tree_head(note.split(kept)[0]).size
            size = head.body["tree"]["size"]
            proof = log.consistency(old_size, size) if old_size <= size else []
        except (note.NoteError, log.LogError) as exc:
            yield Problem("witness", None, GLOBAL_CHAIN, None, f"no consistency proof: {exc}")
            return
        result = witness.check(
            kept=kept,
            current=head.note,
            proof=proof,
            log_key=signing.trusted_public_key(options["public_key"]),
        )
        if not result.consistent:
            yield Problem(
                "witness",
                None,
                GLOBAL_CHAIN,
                None,
                f"checkpoint {head.number} against the note {name} cosigned: {result.sentence}",
            )
