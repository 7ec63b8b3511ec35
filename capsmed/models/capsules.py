"""Capsule machinery shared by every capsule network: squash, routing, layers, decoder.

Shapes: ``B`` batch, ``I`` input capsules, ``J`` output capsules, ``D`` capsule length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from capsmed.errors import CapsmedError
from capsmed.models.compiled import compiled_on_cuda

EPS = 1e-8


def squash(s: torch.Tensor, dim: int = -1, eps: float = EPS) -> torch.Tensor:
    """Sabour et al. eq. 1: shrink a vector's length into [0, 1), keep its direction.

    ``v = |s|^2 / (1 + |s|^2) * s / |s|``; ``eps`` sits inside the square root so the
    gradient stays finite for a zero vector.
    """
    sq = (s * s).sum(dim=dim, keepdim=True)
    return s * (sq / (1.0 + sq) / torch.sqrt(sq + eps))


def capsule_length(v: torch.Tensor, dim: int = -1, eps: float = EPS) -> torch.Tensor:
    """Length of each capsule vector (its presence probability), safe at zero."""
    return torch.sqrt((v * v).sum(dim=dim) + eps)


def dynamic_routing(
    u_hat: torch.Tensor, iterations: int = 3, return_couplings: bool = False,
    squash_outputs: bool = True, eta: float = 1.0, grad_through_routing: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Routing by agreement (Sabour et al. 2017, procedure 1), vectorised.

    Args:
        u_hat: Prediction vectors [B, I, J, D] of each input capsule for each output.
        iterations: Number of times the outputs are computed (Sabour et al.'s count);
            0 or 1 = uniform couplings (no routing: every input sends 1/J of its vote
            to every output).
        return_couplings: Also return the final coupling coefficients [B, I, J].
        squash_outputs: Apply the squash non-linearity (paper 004's ``Squash-fn``).
        eta: Soft update rate (paper 003 eq. 3): ``c <- eta softmax(b) + (1 - eta) c``;
            1 is Sabour et al.'s rule, 0 keeps the couplings uniform.
        grad_through_routing: Backpropagate through every iteration's agreement; if
            False, only through the last weighted sum, with the couplings held constant
            (as Sabour et al.'s released code does).

    Returns:
        Output capsules v [B, J, D] and, optionally, the couplings.
    """
    if iterations < 0:
        raise ValueError(f"routing iterations must be >= 0, got {iterations}")
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"routing eta must be within [0, 1], got {eta}")
    # 0 agreement steps is one pass with uniform couplings
    return _dynamic_routing(u_hat, max(1, iterations), return_couplings, squash_outputs,
                            eta, grad_through_routing)


@compiled_on_cuda
def _dynamic_routing(u_hat: torch.Tensor, iterations: int, return_couplings: bool,
                     squash_outputs: bool, eta: float, grad_through_routing: bool
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    # Routing is a tiny share of the compute but sensitive to precision: keep it fp32.
    with torch.autocast(device_type=u_hat.device.type, enabled=False):
        u_hat = u_hat.float()
        votes = u_hat if grad_through_routing else u_hat.detach()
        logits = u_hat.new_zeros(u_hat.shape[:3])
        # Softmax over the *output* capsules: each input distributes its vote.
        c = F.softmax(logits, dim=2)
        for it in range(iterations):
            if it > 0:
                c = eta * F.softmax(logits, dim=2) + (1.0 - eta) * c
            last = it == iterations - 1
            v = _weighted_sum(c, u_hat if last else votes)
            v = squash(v) if squash_outputs else v
            if not last:
                logits = logits + _agreement(votes, v)
    return v, (c if return_couplings else None)


def _weighted_sum(c: torch.Tensor, u_hat: torch.Tensor) -> torch.Tensor:
    """``s[b, j] = sum_i c[b, i, j] u_hat[b, i, j]`` [B, J, D].

    Eagerly an einsum (no vote-sized temporary). Under torch.compile a product and a
    sum, which the compiler fuses into one pass over the votes; as an einsum it would
    stay a batched matrix-vector product (cuBLAS gemv, slow and unfusable here).
    """
    if torch.compiler.is_compiling():
        return (c.unsqueeze(-1) * u_hat).sum(dim=1)
    return torch.einsum("bij,bijd->bjd", c, u_hat)


def _agreement(u_hat: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``a[b, i, j] = u_hat[b, i, j] . v[b, j]`` [B, I, J] (see :func:`_weighted_sum`)."""
    if torch.compiler.is_compiling():
        return (u_hat * v.unsqueeze(1)).sum(dim=-1)
    return torch.einsum("bijd,bjd->bij", u_hat, v)


COST_REFERENCE_INPUTS = 100.0
LAMBDA_DECAY = 0.95


def lambda_schedule(iterations: int, final_lambda: float) -> list[float]:
    """Inverse temperature per iteration: ``final_lambda * (1 - 0.95**(t+1))``, t = 0..T-1.

    It rises toward ``final_lambda`` as its asymptote (0.05, 0.0975, 0.1426 of it for T=3).
    """
    return [final_lambda * (1.0 - LAMBDA_DECAY ** (t + 1)) for t in range(iterations)]


def em_routing(votes: torch.Tensor, activations: torch.Tensor, beta_u: torch.Tensor,
               beta_a: torch.Tensor, iterations: int = 3, final_lambda: float = 0.01,
               return_couplings: bool = False, eps: float = 1e-8,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """EM routing (Hinton et al. 2018, procedure 1), vectorised over batch and capsules.

    Each output capsule is a diagonal Gaussian over the votes it explains; the M-step
    fits it (mean = pose), the E-step reassigns votes by ``a_j p_j(V_ij)``.

    Args:
        votes: [B, N_in, N_out, P] votes ``V_ij`` (P = 16 for 4x4 poses).
        activations: [B, N_in] input activations ``a_i`` in [0, 1].
        beta_u: Cost per unit of routing mass, broadcastable to [N_out].
        beta_a: Activation offset, broadcastable to [N_out].
        iterations: EM iterations T (>= 1); the last one ends after its M-step.
        final_lambda: Asymptote of the inverse temperature; the M-step of iteration t
            uses ``final_lambda * (1 - 0.95**(t+1))`` (see :func:`lambda_schedule`).
        return_couplings: Also return the assignments R used by the last M-step.
        eps: Added to variances and inside logs, against log(0) and division by 0.

    Returns:
        Poses [B, N_out, P], activations [B, N_out] in (0, 1) and, if requested,
        R [B, N_in, N_out] (sums to 1 over outputs), all float32.
    """
    if votes.dim() != 4 or activations.shape != votes.shape[:2]:
        raise ValueError(f"em_routing needs votes [B, N_in, N_out, P] and activations "
                         f"[B, N_in], got {tuple(votes.shape)} and {tuple(activations.shape)}")
    if iterations < 1:
        raise ValueError("routing needs at least one iteration")
    return _em_routing(votes, activations, beta_u, beta_a, iterations, final_lambda,
                       return_couplings, eps)


@compiled_on_cuda
def _em_routing(votes: torch.Tensor, activations: torch.Tensor, beta_u: torch.Tensor,
                beta_a: torch.Tensor, iterations: int, final_lambda: float,
                return_couplings: bool, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    # Variances, logs and a softmax of large log-likelihoods: bf16/fp16 are not enough.
    with torch.autocast(device_type=votes.device.type, enabled=False):
        v = votes.float()
        a_in = activations.float().unsqueeze(-1)  # [B, N_in, 1]
        b_u = beta_u.float().unsqueeze(-1)  # broadcasts over [B, N_out, P]
        b_a = beta_a.float()
        n_in, n_out = v.shape[1], v.shape[2]
        mass_scale = COST_REFERENCE_INPUTS * n_out / n_in
        r = v.new_full(v.shape[:3], 1.0 / n_out)
        for t, lam in enumerate(lambda_schedule(iterations, final_lambda)):
            # M-step: weight the assignments by the input activations, fit Gaussians.
            ra = r * a_in
            mass = ra.sum(dim=1)  # [B, N_out]
            w = (ra / (mass.unsqueeze(1) + eps)).unsqueeze(-1)  # [B, N_in, N_out, 1]
            mu = (w * v).sum(dim=1)  # [B, N_out, P]
            var = (w * (v - mu.unsqueeze(1)) ** 2).sum(dim=1) + eps
            cost = ((b_u + 0.5 * torch.log(var)) * (mass * mass_scale).unsqueeze(-1)).sum(-1)
            a_out = torch.sigmoid(lam * (b_a - cost))
            if t == iterations - 1:
                break
            # E-step in log space: log a_j + log N(V_ij; mu_j, var_j), softmax over j.
            log_p = -0.5 * (((v - mu.unsqueeze(1)) ** 2 / var.unsqueeze(1)).sum(-1)
                            + torch.log(2 * math.pi * var).sum(-1).unsqueeze(1))
            r = torch.softmax(torch.log(a_out + eps).unsqueeze(1) + log_p, dim=2)
    return mu, a_out, (r if return_couplings else None)


class PrimaryCapsules(nn.Module):
    """A convolution whose channels are grouped into ``types`` capsules of length ``dim``.

    Output: squashed capsules [B, types * H' * W', dim].
    """

    def __init__(self, in_channels: int, types: int, dim: int, kernel_size: int,
                 stride: int, squash: bool = True) -> None:
        super().__init__()
        self.types, self.dim, self.squash = types, dim, squash
        self.conv = nn.Conv2d(in_channels, types * dim, kernel_size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, _, h, w = y.shape
        y = y.view(b, self.types, self.dim, h, w).permute(0, 1, 3, 4, 2)
        y = y.reshape(b, self.types * h * w, self.dim)
        return squash(y) if self.squash else y


class RoutedCapsules(nn.Module):
    """Fully connected capsule layer: transforms W_ij, then routing.

    Args:
        routing: ``dynamic`` (Sabour et al.) or ``em``: EM routing of the vote vectors,
            with the input capsules' lengths as their activations; the class scores
            are then the EM activations and the poses the Gaussian means.
        shared: One transform per output capsule, shared by every input capsule
            (Aff-CapsNet, paper 004) instead of one per (input, output) pair.
        iterations: Routing iterations; 0 or 1 = no agreement step (uniform couplings).
        squash: Squash the outputs (dynamic routing only).
        eta, grad_through_routing: See :func:`dynamic_routing`.
        final_lambda: EM inverse temperature (see :func:`lambda_schedule`).
    """

    def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int,
                 iterations: int = 3, shared: bool = False, squash: bool = True,
                 eta: float = 1.0, grad_through_routing: bool = True,
                 routing: str = "dynamic", final_lambda: float = 0.01,
                 init_std: float = 0.05) -> None:
        super().__init__()
        if not 0.0 <= eta <= 1.0:
            raise CapsmedError(f"routing_eta must be within [0, 1], got {eta}")
        if routing not in ("dynamic", "em"):
            raise CapsmedError(f"routing must be dynamic or em here, got '{routing}'")
        self.iterations, self.squash, self.routing = max(1, iterations), squash, routing
        self.eta, self.grad_through_routing = eta, grad_through_routing
        self.final_lambda = final_lambda
        # W[i, j] maps input capsule i's pose to its prediction for output capsule j;
        # with shared transforms the input axis has length 1 and broadcasts.
        self.weight = nn.Parameter(
            init_std * torch.randn(1 if shared else in_caps, out_caps, out_dim, in_dim))
        if routing == "em":  # learned per-output costs of the EM activation
            self.beta_u = nn.Parameter(torch.zeros(out_caps))
            self.beta_a = nn.Parameter(torch.zeros(out_caps))

    def forward(self, u: torch.Tensor, return_couplings: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Returns output poses [B, J, D], class scores [B, J] and optionally couplings."""
        if self.routing == "em":
            u_hat = capsule_votes(self.weight, u)
            return em_routing(u_hat, capsule_length(u), self.beta_u, self.beta_a,
                              self.iterations, self.final_lambda, return_couplings)
        v, c = _votes_and_dynamic_routing(self.weight, u, self.iterations, return_couplings,
                                          self.squash, self.eta, self.grad_through_routing)
        return v, capsule_length(v), c


def capsule_votes(weight: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Prediction vectors ``u_hat[b, i, j] = W[i, j] u[b, i]`` [B, I, J, D] from
    transforms [I or 1, J, D, C] and input capsules [B, I, C]."""
    w = weight.expand(u.shape[1], -1, -1, -1)  # a view: no copy when shared
    # Kept a batched matmul under torch.compile too: fusing this 8-long sum into the
    # routing's reductions measured 2x slower on an H100 (backward recomputes it).
    return torch.einsum("ijdc,bic->bijd", w, u)


@compiled_on_cuda
def _votes_and_dynamic_routing(weight: torch.Tensor, u: torch.Tensor, iterations: int,
                               return_couplings: bool, squash_outputs: bool, eta: float,
                               grad_through_routing: bool
                               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    # One compiled region for the votes and their routing, so the compiler can lay the
    # vote tensor out for the routing reductions instead of permuting it eagerly.
    return dynamic_routing(capsule_votes(weight, u), iterations, return_couplings,
                           squash_outputs, eta, grad_through_routing)


class MaskedDecoder(nn.Module):
    """Reconstruct the input from the class capsules.

    Conditional (Sabour et al.): all capsules but one are masked to zero, the true
    class during training, otherwise the longest. Plain (paper 004's "normal"
    reconstruction): every capsule is used, unmasked.
    """

    def __init__(self, num_caps: int, caps_dim: int, out_shape: tuple[int, int, int],
                 hidden: tuple[int, ...] = (512, 1024), conditional: bool = True) -> None:
        super().__init__()
        self.out_shape, self.conditional = out_shape, conditional
        sizes = [num_caps * caps_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        c, h, w = out_shape
        layers += [nn.Linear(sizes[-1], c * h * w), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, capsules: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if self.conditional:
            mask = F.one_hot(keep, capsules.shape[1]).to(capsules.dtype)
            capsules = capsules * mask.unsqueeze(-1)
        return self.net(capsules.flatten(1)).view(-1, *self.out_shape)
