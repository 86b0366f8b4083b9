"""References the torch front-door tests compare distmuon.torch.Muon with."""


def fp32_zeropower(grad, ns_coefficients, ns_steps, eps):
    """torch.optim.Muon's Newton-Schulz (torch/optim/_muon.py) in float32 instead of bf16: the
    tests patch it in (torch_muon._zeropower_via_newtonschulz) to compare at distmuon's fp32."""
    a, b, c = ns_coefficients
    x = grad.float()
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        g = x @ x.T
        x = a * x + (b * g + c * g @ g) @ x
    return x.T if grad.size(0) > grad.size(1) else x
