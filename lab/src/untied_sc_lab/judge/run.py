"""`judge run`: asks a chat model for the verdict of every presentation of a prompts file.

Every reply goes to the [`ReplyCache`] the moment it arrives; a request whose reply is cached is never sent again. An
interrupted run (Ctrl-C, a network failure, an exhausted retry budget) is resumed by running the same command again:
only the unanswered presentations are asked (Ctrl-C first lets the requests in flight finish, so their replies are
cached too). The verdicts file is written once every presentation has a reply,
one JSON object per presentation in prompts-file order: `{"id", "verdict", "judge", "reply"}`, `verdict` being
canonical (see [`untied_sc_lab.judge.verdicts`]) or `null` when the reply is unparseable (counted, never guessed).
"""

import json
import os
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from tqdm.auto import tqdm

from .cache import ReplyCache, request_key
from .client import ChatClient
from .export import read_prompts
from .prompt import PromptTemplate, load_template
from .records import JudgedPresentation, RunSummary
from .verdicts import parse_verdict


def default_cache_path(out: str | os.PathLike) -> Path:
    """`<out>.cache.jsonl`: the cache kept beside a verdicts file unless another is named."""
    out = Path(out)
    return out.with_name(out.name + ".cache.jsonl")


def run_judge(
    prompts: str | os.PathLike,
    out: str | os.PathLike,
    client: ChatClient,
    template: PromptTemplate | None = None,
    cache: str | os.PathLike | None = None,
    concurrency: int = 4,
    overwrite: bool = False,
    progress: bool = True,
) -> RunSummary:
    """Judges every presentation of `prompts` and writes the verdicts file `out` (module docstring).

    Args:
        prompts: a prompts file written by `untied-sc judge export`.
        out: the verdicts file to write; an existing one is kept unless `overwrite` (its replies are cached anyway).
        client ([`ChatClient`]): the judge's endpoint and model.
        template ([`PromptTemplate`], *optional*): the judge prompt; default the packaged one.
        cache (*optional*): the reply cache file; default `<out>.cache.jsonl`.
        concurrency (`int`, defaults to 4): requests in flight at once.
        progress (`bool`): show a tqdm bar.

    Returns:
        [`RunSummary`]: presentations judged, requests sent this run, replies taken from the cache, the unparseable
        presentations, and the verdicts and cache files.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to write it again (cached replies are not re-asked).")
    if concurrency < 1:
        raise ValueError(f"`concurrency` must be at least 1, got {concurrency}.")
    template = template or load_template()
    items = read_prompts(prompts)
    replies = ReplyCache(cache or default_cache_path(out))
    requests = []
    for item in items:
        messages = template.messages(item.answer_a, item.answer_b)
        requests.append((item.id, messages, request_key(client.body(messages))))
    todo = {key: (id_, messages) for id_, messages, key in requests if key not in replies}
    num_cached = sum(key in replies for _, _, key in requests)
    num_unique = len({key for _, _, key in requests})  # identical presentations share one request

    def ask(key: str) -> None:
        id_, messages = todo[key]
        replies.add(key, client.complete(messages), id_)

    bar = tqdm(
        total=num_unique, initial=num_unique - len(todo), desc=f"judging with {client.model}", disable=not progress
    )
    executor = ThreadPoolExecutor(max_workers=concurrency)
    try:
        pending = {executor.submit(ask, key) for key in todo}
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            bar.update(len(done))
            for future in done:
                future.result()  # re-raises a failure; finished replies are already cached
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        bar.close()

    unparseable = []
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with partial.open("w", encoding="utf-8") as handle:
        for id_, _, key in requests:
            reply = replies.get(key)
            verdict = parse_verdict(reply.content)
            if verdict is None:
                unparseable.append(id_)
            record = JudgedPresentation(id_, verdict, client.model, reply.content)
            handle.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
    partial.replace(out)
    return RunSummary(len(requests), len(todo), num_cached, tuple(unparseable), str(out), str(replies.path))
