"""BM25 (via `bm25s`): an index saved beside a manifest like the dense one, and the same batched `search`.

The corpus is tokenised in chunks (English stop words removed, no stemmer so nothing beyond bm25s is needed), and
the tokenizer's vocabulary is saved with the index so queries map to the same token ids.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np

from maps_train.errors import MapsTrainError
from maps_train.retrieval.base import Hit
from maps_train.retrieval.corpus import FINGERPRINT_METHOD, Corpus
from maps_train.retrieval.manifest import FORMAT_VERSION, check_manifest, has_manifest, read_manifest, write_json_atomic

logger = logging.getLogger(__name__)

BM25_DIR = "bm25"
STOPWORDS = "en"


def _tokenizer():
    import bm25s

    return bm25s.tokenization.Tokenizer(stopwords=STOPWORDS)


def build_bm25_index(
    corpus_path: str | Path,
    out_dir: str | Path,
    force: bool = False,
    chunk_size: int = 50_000,
    show_progress: bool = True,
) -> Path:
    import bm25s
    from tqdm import tqdm

    out = Path(out_dir)
    if has_manifest(out) and not force:
        check_manifest(read_manifest(out), out, corpus=corpus_path, kind="bm25")
        logger.info("index %s is already built; pass force=True (--force) to rebuild", out)
        return out
    (out / "manifest.json").unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    corpus = Corpus(corpus_path)
    if len(corpus) == 0:
        raise MapsTrainError(f"{corpus_path}: the corpus has no passages")
    tokenizer = _tokenizer()
    token_ids: list[list[int]] = []
    with tqdm(total=len(corpus), unit="passage", desc="tokenising", disable=not show_progress) as bar:
        for start in range(0, len(corpus), chunk_size):
            texts = [passage.contents for passage in corpus.iter_rows(start, start + chunk_size)]
            token_ids.extend(tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False))
            bar.update(len(texts))
    retriever = bm25s.BM25()
    retriever.index(tokenizer.to_tokenized_tuple(token_ids), show_progress=show_progress)
    del token_ids
    bm25_dir = out / BM25_DIR
    retriever.save(str(bm25_dir), show_progress=False)
    tokenizer.save_vocab(str(bm25_dir))
    tokenizer.save_stopwords(str(bm25_dir))
    manifest = {
        "format_version": FORMAT_VERSION,
        "kind": "bm25",
        "corpus": {
            "path": str(corpus.path),
            "format": corpus.format,
            "checksum": corpus.fingerprint,
            "checksum_method": FINGERPRINT_METHOD,
            "count": len(corpus),
        },
        "count": len(corpus),
        "index": {
            "type": "bm25",
            "dir": BM25_DIR,
            "params": {"k1": retriever.k1, "b": retriever.b, "method": retriever.method, "stopwords": STOPWORDS},
        },
        "build": {"seconds_this_run": round(time.perf_counter() - started, 2)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json_atomic(out / "manifest.json", manifest)
    corpus.close()
    return out


class BM25Retriever:
    """`search(queries, k)`: one bm25s call per batch; passages with score 0 (no query term) are left out."""

    def __init__(self, index_dir: str | Path, corpus: str | Path | None = None):
        import bm25s

        self.index_dir = Path(index_dir)
        self.manifest = read_manifest(self.index_dir)
        corpus_path = corpus or self.manifest["corpus"]["path"]
        check_manifest(self.manifest, self.index_dir, corpus=corpus_path, kind="bm25")
        self.corpus = Corpus(corpus_path)
        bm25_dir = str(self.index_dir / self.manifest["index"]["dir"])
        self.bm25 = bm25s.BM25.load(bm25_dir, mmap=True, show_progress=False)
        self.tokenizer = _tokenizer()
        self.tokenizer.load_vocab(bm25_dir)
        self.tokenizer.load_stopwords(bm25_dir)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.corpus)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = max(1, min(int(k), len(self.corpus)))
        with self._lock:
            token_ids = self.tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
            rows, scores = self.bm25.retrieve(token_ids, k=k, show_progress=False, n_threads=1)
        results = []
        for row_ids, row_scores in zip(np.asarray(rows), np.asarray(scores)):
            hits = []
            for row, score in zip(row_ids.tolist(), row_scores.tolist()):
                if score <= 0:
                    break  # sorted: the rest share no term with the query
                passage = self.corpus[row]
                hits.append(Hit(passage.id, passage.title, passage.text, float(score)))
            results.append(hits)
        return results
