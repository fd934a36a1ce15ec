"""Client-driven runs: ART's own client, in the user's environment, drives a run through ART's
ServerlessBackend protocol (the `/preview/...` routes under /api/v1/art/) and the OpenAI endpoint beside
them. Each posted training job becomes one step of the run, through the same queued, leased, exactly-once
step as an uploaded script's (training.services.steps: this app is the step source of Run.Driver.CLIENT)."""
