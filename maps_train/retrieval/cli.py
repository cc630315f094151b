"""`maps-train index build` and `maps-train retrieve serve|search`: thin wrappers over the package."""

from __future__ import annotations

import logging
from pathlib import Path

import typer


def _log_setup() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("faiss", "bm25s", "httpx", "sentence_transformers"):  # their INFO/DEBUG lines bury ours
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _settings(recipe: str | None, overrides: list[str], **fields):
    """The recipe's retrieval section with the command-line flags that were given laid over it."""
    from dataclasses import replace

    from maps_train.errors import MapsTrainError
    from maps_train.recipe import load_recipe

    choices = {
        "kind": ("dense", "bm25"),
        "index_type": ("flat", "hnsw", "ivfpq"),
        "embedding_dtype": ("float16", "float32"),
    }
    for name, allowed in choices.items():
        if fields.get(name) is not None and fields[name] not in allowed:
            flag = "--" + name.replace("_", "-")
            raise MapsTrainError(f"{flag} {fields[name]}: expected one of {', '.join(allowed)}")
    settings = load_recipe(recipe, overrides).retrieval
    return replace(settings, **{name: value for name, value in fields.items() if value is not None})


def register(app: typer.Typer) -> None:
    index_app = typer.Typer(help="Build retrieval indexes (dense FAISS or BM25).", no_args_is_help=True)
    retrieve_app = typer.Typer(help="Search an index and serve it over HTTP (recall: maps-train eval-recall).", no_args_is_help=True)
    app.add_typer(index_app, name="index")
    app.add_typer(retrieve_app, name="retrieve")

    @index_app.command("build")
    def build(
        corpus: str | None = typer.Option(None, help="FlashRAG .jsonl or DPR .tsv (default: recipe's)"),
        out: str | None = typer.Option(None, help="Index directory (default: derived from corpus + encoder)"),
        encoder: str | None = typer.Option(None, help="builtin:minilm-l6, intfloat/e5-base-v2, a local path"),
        kind: str | None = typer.Option(None, help="dense | bm25"),
        index_type: str | None = typer.Option(None, help="flat | hnsw | ivfpq (dense only)"),
        chunk_size: int | None = typer.Option(None, help="Passages per resumable chunk"),
        batch_size: int | None = typer.Option(None, help="Encoder batch size"),
        embedding_dtype: str | None = typer.Option(None, help="float16 | float32 (the on-disk matrix)"),
        keep_embeddings: bool = typer.Option(True, help="Keep embeddings.npy after indexing"),
        force: bool = typer.Option(False, help="Rebuild even if a finished index is there"),
        recipe: str | None = typer.Option(None, help="Take defaults from this recipe's retrieval section"),
        overrides: list[str] = typer.Argument(None, help="Dotted recipe overrides, e.g. retrieval.pq_m=48"),
    ) -> None:
        """Embed a corpus (resumable: rerun after a kill to continue) and build the index + manifest.json."""
        _log_setup()
        from maps_train.retrieval.build import build_index
        from maps_train.retrieval.factory import default_index_dir
        from maps_train.runlock import sole_writer

        settings = _settings(
            recipe,
            overrides or [],
            corpus=corpus,
            encoder=encoder,
            kind=kind,
            index_type=index_type,
            chunk_size=chunk_size,
            encode_batch_size=batch_size,
            embedding_dtype=embedding_dtype,
        )
        out_dir = out or settings.index_dir or str(default_index_dir(settings))
        extra = {} if settings.kind == "bm25" else {"keep_embeddings": keep_embeddings}
        index_dir = Path(out_dir).expanduser()
        # One builder per index: the same lock file a run that builds a missing index waits on (`factory`).
        with sole_writer(index_dir.parent, "maps-train index build", name=f"{index_dir.name}.lock"):
            build_index(settings, out_dir, force=force, **extra)
        typer.echo(f"index ready: {out_dir}")

    @retrieve_app.command("serve")
    def serve(
        index: str = typer.Option(..., help="An index directory (dense or BM25)"),
        host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)"),
        port: int = typer.Option(8001),
        corpus: str | None = typer.Option(None, help="The corpus, if it moved since the build"),
        max_batch: int = typer.Option(32, min=1, help="Most queries in one search call (larger requests are cut)"),
        max_batch_hits: int = typer.Option(2048, min=1, help="Most queries x k in one search call"),
        max_wait_ms: float = typer.Option(5.0, help="How long a request waits for others to join its batch"),
        # ServiceLimits' defaults, written out because importing the service (FastAPI) would slow every command;
        # tests/test_retrieval_service_limits.py checks that they agree
        max_queries: int = typer.Option(2048, min=1, help="Most queries in one request (more: HTTP 413)"),
        max_k: int = typer.Option(1000, min=1, help="Largest k a request may ask for (more: HTTP 413)"),
        max_query_chars: int = typer.Option(2048, min=1, help="Longest query in characters (longer: HTTP 413)"),
        max_hits: int = typer.Option(32768, min=1, help="Most queries x k in one request: bounds the response"),
        max_body_bytes: int = typer.Option(2 * 1024 * 1024, min=1, help="Largest request body, checked before parsing"),
        read_timeout_s: int = typer.Option(10, min=1, help="Seconds to read a request's body (slower: dropped, 408)"),
        header_timeout_s: int = typer.Option(5, min=1, help="Seconds to receive a request's headers (slower: closed)"),
        send_timeout_s: int = typer.Option(30, min=1, help="Seconds a client may take to read a part of its answer"),
        max_connections: int = typer.Option(512, min=1, help="Connections served at once (more wait to be accepted)"),
    ) -> None:
        """Serve POST /search {queries, k} and GET /health under granian, searching concurrent requests fairly.

        Requests over a limit get HTTP 413, malformed ones (k not a JSON integer, a query not a valid string) 422,
        each with a one-line detail naming the field and the option to raise. Limits and measured load:
        docs/retrieval-service.md.
        """
        _log_setup()
        from maps_train.retrieval.service import ServiceLimits
        from maps_train.retrieval.service import serve as run_service

        limits = ServiceLimits(
            max_queries=max_queries,
            max_k=max_k,
            max_query_chars=max_query_chars,
            max_hits=max_hits,
            max_body_bytes=max_body_bytes,
            read_timeout_s=read_timeout_s,
            header_timeout_s=header_timeout_s,
            send_timeout_s=send_timeout_s,
            max_connections=max_connections,
        )
        run_service(
            index,
            host=host,
            port=port,
            corpus=corpus,
            max_batch=max_batch,
            max_batch_hits=max_batch_hits,
            max_wait_ms=max_wait_ms,
            limits=limits,
        )

    @retrieve_app.command("search")
    def search(
        queries: list[str] = typer.Argument(..., help="One or more queries"),
        index: str | None = typer.Option(None, help="An index directory (default: from the recipe)"),
        url: str | None = typer.Option(None, help="A running retrieval service instead of an index"),
        k: int = typer.Option(5, "-k", "--k", help="Hits per query"),
        recipe: str | None = typer.Option(None),
        chars: int = typer.Option(160, help="Passage characters to print"),
    ) -> None:
        """Print the top-k passages for each query."""
        from maps_train.retrieval.factory import build_retriever, load_retriever

        if index and not url:
            retriever = load_retriever(index)
        else:
            retriever = build_retriever(_settings(recipe, [], service_url=url))
        for query, hits in zip(queries, retriever.search(list(queries), k)):
            typer.echo(f"## {query}")
            for rank, hit in enumerate(hits, start=1):
                text = hit.text.replace("\n", " ")[:chars]
                typer.echo(f"{rank:>2}. [{hit.score:.3f}] {hit.id} | {hit.title} | {text}")
