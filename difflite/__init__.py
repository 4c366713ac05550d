"""difflite: diffusers Stable Diffusion pipelines -> TFLite (LiteRT) output folders, and the runtime that runs them."""
