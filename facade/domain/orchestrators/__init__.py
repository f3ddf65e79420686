"""Session orchestrators: what answers ``session.tell``. The built-in one follows commands; the
model-backed one (an actor with provider ``openai``) answers from the model."""
