"""Small models shared by the exporter tests."""
import torch


class Served(torch.nn.Module):
    """int64 and f32 inputs (one keyword-only), a tied weight, nested outputs."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.proj = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens, *, scale):
        hidden = torch.relu(self.proj(self.embed(tokens))) * scale
        return {"logits": self.out(hidden), "pooled": [hidden.sum(1)]}


class Counter(torch.nn.Module):
    """Mutates a buffer in forward: the new state must carry to the next call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.total.add_(x)
        return self.total * 2


def served_example() -> tuple[Served, torch.Tensor, torch.Tensor]:
    """A seeded ``Served`` and its inputs: ``model(tokens, scale=scale)``."""
    torch.manual_seed(0)
    return Served().eval(), torch.randint(0, 10, (2, 5)), torch.rand(2, 5, 8)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


def tiny_example() -> tuple[Tiny, tuple[torch.Tensor]]:
    """A factory for ``torch-stablehlo export``: ``(model, args)``."""
    torch.manual_seed(0)
    return Tiny().eval(), (torch.randn(3, 8),)
