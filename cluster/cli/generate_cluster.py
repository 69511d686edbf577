"""`raypd generate --mode pd|mixed`: start the node actors (and the Conductor), send every prompt
through them at once, each to the nodes the Conductor picks (`--policy none`: the driver's
round-robin), and return CompletionOutputs like the single-engine LLM.generate."""
from __future__ import annotations

import asyncio

from raypd.cluster.client.router import RoundRobinRouter, Router
from raypd.cluster.launch.local_cluster import ClusterSpec, NodeCluster
from raypd.cluster.client.request_driver import RequestDriver
from raypd.engine.llm import encode_prompt
from raypd.engine.model.source import resolve_model
from raypd.engine.outputs import CompletionOutput
from raypd.engine.sampling_params import SamplingParams
from raypd.engine.tokenizer import Tokenizer


class GenerationError(RuntimeError):
    """A request ended with an error on the cluster."""


def spec_from_args(args) -> ClusterSpec:
    from raypd.cluster.cli.generate import engine_options

    options = {k: v for k, v in engine_options(args).items() if k != "num_threads"}
    role_options = {"decode": {"num_blocks": args.decode_num_blocks}} if args.decode_num_blocks else {}
    if min(args.prefill_nodes, args.decode_nodes) < 1 if args.mode == "pd" else args.mixed_nodes < 1:
        raise ValueError("--mode pd needs >= 1 prefill and decode node; --mode mixed needs >= 1 mixed node")
    from raypd.conductor.policies import POLICIES
    if args.policy != "none" and args.policy not in POLICIES:
        raise ValueError(f"unknown --policy {args.policy!r}; one of none, {', '.join(sorted(POLICIES))}")
    if args.mode == "pd":
        counts = dict(prefill_nodes=args.prefill_nodes, decode_nodes=args.decode_nodes)
    else:
        counts = dict(mixed_nodes=args.mixed_nodes)
    return ClusterSpec(model=args.model, engine_options=options, role_engine_options=role_options,
                       transfer_options={"backend": args.transfer_backend}, cpus_per_node=args.cpus_per_node,
                       gpus_per_node=args.gpus_per_node, place_by_role=args.place_by_role,
                       policy=None if args.policy == "none" else args.policy, **counts)


def generate_on_cluster(args, prompts: list, params: SamplingParams) -> list[CompletionOutput]:
    tokenizer = Tokenizer(resolve_model(args.model))
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    with NodeCluster.start(spec_from_args(args), address=args.address) as cluster, \
            RequestDriver(cluster.nodes, chunk_timeout_s=args.timeout) as driver:
        router = _router(cluster, driver)
        results = asyncio.run(_run_all(driver, router, encoded, params))
    outputs = []
    for i, (ids, (tokens, final)) in enumerate(zip(encoded, results)):
        if final.error:
            raise GenerationError(f"prompt {i}: {final.error}")
        outputs.append(CompletionOutput(f"req-{i}", ids, tokens, tokenizer.decode(tokens), final.finish_reason,
                                        final.num_cached_tokens))
    return outputs


def _router(cluster: NodeCluster, driver: RequestDriver) -> Router:
    if cluster.conductor is None:
        return RoundRobinRouter(driver)
    from raypd.cluster.client.conductor_router import ConductorRouter
    return ConductorRouter(cluster.conductor, cluster.nodes)


async def _run_all(driver: RequestDriver, router: Router, encoded: list[list[int]], params: SamplingParams):
    async def one(i: int, ids: list[int]):
        rid = f"req-{i}"
        route = await router.route(rid, ids)
        tokens: list[int] = []
        async for chunk in driver.generate(rid, ids, params, route.prefill, route.decode):
            tokens.extend(chunk.token_ids)
            if chunk.finished:
                if chunk.error is None:
                    await router.delivered(rid, chunk.num_cached_tokens)
                return tokens, chunk
        raise GenerationError(f"prompt {i}: the stream ended without a final message")
    return await asyncio.gather(*(one(i, ids) for i, ids in enumerate(encoded)))
