from django.core.management.base import BaseCommand

from audit.checkpoints import checkpoint_create


class Command(BaseCommand):
    help = "Sign the current audit chain heads and write the checkpoint file (AUDIT_CHECKPOINT_DIR)."

    def handle(self, *args, **options):
        checkpoint = checkpoint_create()
        heads = len(checkpoint.body["heads"])
        self.stdout.write(
            f"checkpoint {checkpoint.number}: {heads} chain head(s) signed with key {checkpoint.key_id}; file {checkpoint.file_name}"
        )
