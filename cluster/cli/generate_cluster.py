"""`raypd generate --mode pd|mixed`: start the node actors (and the Conductor), send every prompt
through them at once, each to the nodes the Conductor picks (`--policy none`: round-robin, see
client/make_router.py), and return CompletionOutputs like the single-engine LLM.generate."""
from __future__ import annotations

import asyncio

from raypd.cluster.cli.engine_args import engine_options
from raypd.cluster.cli.transfer_args import transfer_options
from raypd.cluster.client.make_router import make_router
from raypd.cluster.client.request_driver import RequestDriver
from raypd.cluster.client.router import Router
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.conductor.policies import POLICIES
from raypd.engine.model.source import resolve_model
from raypd.engine.outputs import CompletionOutput
from raypd.engine.tokenizer import Tokenizer, encode_prompt
from raypd.protocol.roles import Role
from raypd.protocol.sampling_params import SamplingParams


class GenerationError(RuntimeError):
    """A request ended with an error on the cluster."""


def spec_from_args(args) -> ClusterSpec:
    role_options = {Role.DECODE: {"num_blocks": args.decode_num_blocks}} if args.decode_num_blocks else {}
    if min(args.prefill_nodes, args.decode_nodes) < 1 if args.mode == "pd" else args.mixed_nodes < 1:
        raise ValueError("--mode pd needs >= 1 prefill and decode node; --mode mixed needs >= 1 mixed node")
    if args.policy != "none" and args.policy not in POLICIES:
        raise ValueError(f"unknown --policy {args.policy!r}; one of none, {', '.join(sorted(POLICIES))}")
    if args.mode == "pd":
        counts = dict(prefill_nodes=args.prefill_nodes, decode_nodes=args.decode_nodes)
    else:
        counts = dict(mixed_nodes=args.mixed_nodes)
    return ClusterSpec(model=args.model, engine_options=engine_options(args), role_engine_options=role_options,
                       transfer_options=transfer_options(args), cpus_per_node=args.cpus_per_node,
                       gpus_per_node=args.gpus_per_node, place_by_role=args.place_by_role,
                       policy=None if args.policy == "none" else args.policy, **counts)


def generate_on_cluster(args, prompts: list, params: SamplingParams) -> list[CompletionOutput]:
    tokenizer = Tokenizer(resolve_model(args.model))
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    with NodeCluster.start(spec_from_args(args), address=args.address) as cluster, \
            RequestDriver(chunk_timeout_s=args.timeout) as driver:
        router = make_router(cluster.conductor, cluster.nodes)
        results = asyncio.run(_run_all(driver, router, encoded, params))
    outputs = []
    for i, (ids, (tokens, final)) in enumerate(zip(encoded, results)):
        if final.error:
            raise GenerationError(f"prompt {i}: {final.error}")
        outputs.append(CompletionOutput(f"req-{i}", ids, tokens, tokenizer.decode(tokens), final.finish_reason,
                                        final.num_cached_tokens))
    return outputs


async def _run_all(driver: RequestDriver, router: Router, encoded: list[list[int]], params: SamplingParams):
    async def one(i: int, ids: list[int]):
        rid = f"req-{i}"
        route = await router.route(rid, ids, priority=params.priority)
        tokens: list[int] = []
        async for chunk in driver.generate(rid, ids, params, route.prefill, route.decode):
            tokens.extend(chunk.token_ids)
            if chunk.finished:
                if chunk.error is None:
                    await router.delivered(rid, chunk.num_cached_tokens)
                return tokens, chunk
        raise GenerationError(f"prompt {i}: the stream ended without a final message")
    return await asyncio.gather(*(one(i, ids) for i, ids in enumerate(encoded)))
