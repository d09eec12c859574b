"""A real tree draft-and-verify loop, for tests only: SGLang's tree drafts grown by the served head, verified by the
target with SGLang's tree speculative sampling, written from the kernel (sglang 0.5.23
sgl_kernel/speculative/sampling.cuh TreeSpeculativeSamplingTargetOnly, thresholds 1 and 1).

At anchor p (the target has just emitted x_p): the head's row pass over the committed tokens, then the tree at p
(mtp_observe.drafting.tree.grow / select: the drafting under test is the product's, as the chain loop drafts with the
served head); the target runs x_p and each root-to-leaf path on a copy of its cache of the committed tokens (one
forward per leaf, so a node's q is the target's distribution after exactly its path: tree attention for the
full-attention layers, and the only right reading for the linear-attention ones, whose state cannot branch); then, from the root, one coin per node and the children in
ascending node index: accept the first child c with q_u(c) > 0 and coin < q_u(c_1) + .. + q_u(c); if none is
accepted, or at depth S, the bonus is sampled from q_u with the rejected children removed. The sampler is
tests/test_sampler.vllm_sampler (penalties count the turn's output and the path's drafts, as vLLM counts a
step's drafts). Shares no code with mtp_observe's verification (tree_acceptance.py).
"""

from __future__ import annotations

import torch

from mtp_observe.drafting.tree import grow, select

from .test_sampler import vllm_sampler


def _draw(q: torch.Tensor, u: float) -> int:
    cdf = torch.cumsum(q, 0)
    return min(int(torch.searchsorted(cdf, u * float(cdf[-1]), right=True)), q.shape[0] - 1)


def tree_speculative(target, head, prompt: list[int], profile, S: int, K: int, T: int, n_new: int,
                     gen: torch.Generator, attention: str = "slot"):
    """-> (prompt + n_new tokens, [(anchor p, accepted drafts a)] one per verify step)."""
    import copy

    from transformers import DynamicCache

    from mtp_observe.model.target import _cache_kwarg

    kw = _cache_kwarg(target.model)

    def uniform() -> float:
        return float(torch.rand((), generator=gen, dtype=torch.float64))

    def forward(tokens, cache):  # tokens after the cache's -> (post-norm hidden [n, H], logits [n, V]); the cache advances
        with torch.no_grad():
            h = target.model(input_ids=torch.tensor(tokens)[None], use_cache=True, **{kw: cache}).last_hidden_state[0]
            return h, target.lm_head(h).double()

    x = list(prompt)
    s = len(prompt)
    committed = DynamicCache(config=target.config)
    hidden, logits = forward(x, committed)  # h_0 .. h_{s-1}
    x.append(_draw(vllm_sampler(logits[-1], profile, prompt, []), uniform()))  # x_s comes from the prefill
    rows, steps = None, []
    while len(x) < s + n_new:
        p = len(x) - 1  # the cache has consumed x_0 .. x_{p-1}; hidden holds h_0 .. h_{p-1}
        done = rows.states.shape[0] if rows is not None else 0
        rows = head.row_pass(hidden[done:p], torch.tensor(x[done + 1 : p + 1], device=head.device), prefix=rows)
        grown = grow(head, rows, torch.tensor([p]), K, S, attention)
        kept = torch.nonzero(select(grown, S, T)[0]).squeeze(1).tolist()  # ascending global id: node 1, 2, ...
        node = {g: i + 1 for i, g in enumerate(kept)}
        token = [x[p]] + [int(grown.tokens[0, g]) for g in kept]
        parent = [-1] + [0 if int(grown.parent[0, g]) < 0 else node[int(grown.parent[0, g])] for g in kept]
        children = {u: [v for v in range(1, len(token)) if parent[v] == u] for u in range(len(token))}

        def path(v):
            out = []
            while v > 0:
                out.append(v)
                v = parent[v]
            return out[::-1]

        q, states = {}, {}
        for leaf in [v for v in range(len(token)) if not children[v]]:
            nodes = path(leaf)
            h, verify = forward([x[p]] + [token[v] for v in nodes], copy.deepcopy(committed))  # verify[j]: after j nodes
            for j, u in enumerate([0] + nodes):
                if u not in q:
                    q[u] = vllm_sampler(verify[j], profile, prompt, x[s:] + [token[v] for v in nodes[:j]])
                    states[u] = h[j]
        u, depth, emitted = 0, 0, []
        while True:
            rejected, acc, coin, chosen = [], 0.0, uniform(), None
            if depth < S:
                for v in children[u]:
                    qv = float(q[u][token[v]])
                    acc += qv
                    if qv > 0 and coin < acc:
                        chosen = v
                        break
                    rejected.append(token[v])
            if chosen is None:
                residual = q[u].clone()
                if depth < S:
                    residual[rejected] = 0.0
                emitted.append(_draw(residual, uniform()))
                break
            emitted.append(token[chosen])
            u, depth = chosen, depth + 1
        a = len(emitted) - 1
        steps.append((p, a))
        forward([x[p]] + emitted[:a], committed)  # x_p and the accepted drafts: the committed cache advances over them
        accepted_path = [0] + path(u)
        hidden = torch.cat([hidden, torch.stack([states[v] for v in accepted_path])])  # h_p .. h_{p+a}
        x.extend(emitted)
    return x[: s + n_new], steps
