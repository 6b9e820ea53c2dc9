"""A diffusers pipeline built tiny from configs (no download): a small UNet2DConditionModel and a DDIM scheduler.

Importable from a subprocess (`PYTHONPATH=tests/aitune_aot`); importing it imports diffusers (a few seconds).
"""

import torch
from diffusers import DDIMScheduler, DiffusionPipeline, UNet2DConditionModel

UNET_CONFIG = {
    "sample_size": 8,
    "in_channels": 4,
    "out_channels": 4,
    "layers_per_block": 1,
    "block_out_channels": (8, 16),
    "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
    "cross_attention_dim": 8,
    "norm_num_groups": 4,
    "attention_head_dim": 2,
}


class TinyDiffusionPipeline(DiffusionPipeline):
    """Denoises latents for a few DDIM steps, conditioned on text embeddings."""

    def __init__(self, unet: UNet2DConditionModel, scheduler: DDIMScheduler) -> None:
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler)

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor, text: torch.Tensor, steps: int = 2) -> torch.Tensor:
        self.scheduler.set_timesteps(steps)
        for t in self.scheduler.timesteps:
            # return_dict=False: aitune's output tree does not yet round-trip diffusers' BaseOutput
            noise = self.unet(latents, t, encoder_hidden_states=text, return_dict=False)[0]
            latents = self.scheduler.step(noise, t, latents).prev_sample
        return latents


def build_pipeline(seed: int = 0) -> TinyDiffusionPipeline:
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**UNET_CONFIG).eval()
    return TinyDiffusionPipeline(unet=unet, scheduler=DDIMScheduler(num_train_timesteps=10))


def pipeline_inputs(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 4, 8, 8, generator=generator), torch.randn(2, 3, 8, generator=generator)
