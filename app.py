"""EAGLE Lens: the teaching app. `python app.py` (and Hugging Face Spaces) start it here.

Which models it serves, and its caps, come from environment variables only (see
app/ui/settings.py); the page can never choose a model. Without a trained draft head the app
still starts, offering vanilla decoding and recorded traces.
"""
from app.ui.blocks import build_demo, launch_kwargs
from app.ui.settings import load_context


def main() -> None:
    ctx = load_context()
    demo = build_demo(ctx)
    demo.launch(**launch_kwargs(ctx.config))  # never share=True: a public link is the host's choice


if __name__ == "__main__":
    main()
