"""Actions the broker lost in transit, found and published again by the client that sent them.

kombu's Redis transport moves a message in two round trips: ``BRPOP`` takes it off the queue
list, then a second command records it in the ``unacked`` hash. A worker SIGKILLed, or a Redis
restarted, between the two loses the message: it is in no list and no hash, kombu never restores
it, and the action never runs. Restoring a dead worker's messages has the same gap the other way
round (``HDEL`` from the hash, then ``LPUSH``).

The client that published an action still holds it, so it audits its unfinished actions: an
action is *present* while one of its queue's lists (any priority step) or the ``unacked`` hash
holds its message, and *finished* once a result is stored. The broker is read before the
results, so an action acked between the two reads is seen as finished. An action neither
present nor finished in two audits at least ``confirm_s`` apart is lost, and is published
again under the same id. That is safe: the gaps above last milliseconds while audits are
seconds apart, and an id's result is stored once (:mod:`tangram_celery.tasks.ledger`), so a
copy that did survive somewhere returns the stored result instead of running again.

:func:`audit` is the pure decision; :func:`broker_action_ids` is the one read of Redis.

A CPU node that stops heart-beating for good strands the actions queued for it, and its
trajectories' environments are gone with it. After ``TANGRAM_STRANDED_AFTER_S`` the client
takes such an action's message out of the broker and stores its answer (:func:`take_action`, one
atomic script that first checks the node is still silent, so a node coming
back cannot also run it) and stores a ``node_lost`` result for it, so the training loop gets an
answer instead of waiting forever; the trajectory is unpinned, and its next action starts afresh
on a live node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import redis

from tangram_celery import keys
from tangram_celery.connection import durable, idempotent
from tangram_celery.pools.inventory import UNACKED_KEY, priority_lists

UNACKED_INDEX_KEY = "unacked_index"

SCAN_CHUNK = 200
"""List elements copied into the Lua script per ``LRANGE`` while scanning a queue."""

TAIL_CHARS = 4096
"""A message's task id (``correlation_id``) sits in its properties, near the end of the JSON."""

_COMMON_LUA = """
local needle = '"correlation_id": "'
local function id_of(v)
  local from = #v - tonumber(ARGV[3])
  if from < 1 then from = 1 end
  local s, e = string.find(v, needle, from, true)
  if not s and from > 1 then s, e = string.find(v, needle, 1, true) end
  if not s then return nil end
  local stop = string.find(v, '"', e + 1, true)
  if not stop then return nil end
  return string.sub(v, e + 1, stop - 1)
end
local function each_listed(visit)
  local chunk = tonumber(ARGV[2])
  for _, key in ipairs(KEYS) do
    local start = 0
    while true do
      local items = redis.call('LRANGE', key, start, start + chunk - 1)
      for _, v in ipairs(items) do
        local found = visit(key, v)
        if found then return found end
      end
      if #items < chunk then break end
      start = start + chunk
    end
  end
  return nil
end
"""

BROKER_IDS_SCRIPT = idempotent(_COMMON_LUA + """
local out = {}
each_listed(function(_, v)
  local id = id_of(v)
  if id then out[#out + 1] = id end
  return nil
end)
for _, v in ipairs(redis.call('HVALS', ARGV[1])) do
  local id = id_of(v)
  if id then out[#out + 1] = id end
end
return out
""")

TAKE_SCRIPT = _COMMON_LUA + """
-- ARGV: unacked, chunk, tail, action id, unacked index, node hash, silent s, result key,
--       answer, answer ttl
local t = redis.call('TIME')
local beat = tonumber(redis.call('HGET', ARGV[6], 'heartbeat') or '0')
if tonumber(t[1]) + tonumber(t[2]) / 1000000 - beat <= tonumber(ARGV[7]) then return false end
local function answer(v)
  redis.call('SET', ARGV[8], ARGV[9], 'NX', 'EX', ARGV[10])
  return v
end
local taken = each_listed(function(key, v)
  if id_of(v) == ARGV[4] then
    redis.call('LREM', key, 1, v)
    return v
  end
  return nil
end)
if taken then return answer(taken) end
local pairs_ = redis.call('HGETALL', ARGV[1])
for i = 1, #pairs_, 2 do
  if id_of(pairs_[i + 1]) == ARGV[4] then
    redis.call('HDEL', ARGV[1], pairs_[i])
    redis.call('ZREM', ARGV[5], pairs_[i])
    return answer(pairs_[i + 1])
  end
end
return false
"""


@dataclass(frozen=True)
class AuditOutcome:
    """One audit's decision: what to publish again, what is done, what to look at next time."""

    lost: tuple[str, ...]
    finished: tuple[str, ...]
    suspects: Mapping[str, float]
    """Actions missing in this audit, with the time they were first seen missing."""


def audit(
    candidates: Iterable[str],
    present: AbstractSet[str],
    finished: AbstractSet[str],
    suspects: Mapping[str, float],
    now: float,
    confirm_s: float,
) -> AuditOutcome:
    """Decide which of ``candidates`` are lost.

    ``present`` holds the ids the broker holds, ``finished`` those with a stored result, and
    ``suspects`` the previous audit's missing actions. An action is lost when it is missing now
    and was already missing at least ``confirm_s`` ago; a lost action leaves the suspects (it
    is published again, and has to go missing twice more before it is published a third time).
    """
    lost: list[str] = []
    done: list[str] = []
    missing: dict[str, float] = {}
    for action_id in candidates:
        if action_id in finished:
            done.append(action_id)
        elif action_id in present:
            continue
        elif now - suspects.get(action_id, now) >= confirm_s:
            lost.append(action_id)
        else:
            missing[action_id] = suspects.get(action_id, now)
    return AuditOutcome(tuple(lost), tuple(done), missing)


def stranded(queues: Mapping[str, str], dead_nodes: AbstractSet[str]) -> list[str]:
    """The actions (id -> queue) queued for a CPU node in ``dead_nodes``."""
    return [action_id for action_id, queue in queues.items()
            if keys.cpu_node_of_queue(queue) in dead_nodes]


def broker_action_ids(
    client: redis.Redis, queues: Iterable[str], sep: str, steps: Sequence[int],
) -> set[str]:
    """The task ids of every message in ``queues`` (all priority lists) or held unacked.

    One Lua script reads it all atomically, in chunks, and returns only the ids.
    """
    lists = [name for queue in sorted(set(queues)) for _, name in priority_lists(queue, sep, steps)]
    raw = client.eval(BROKER_IDS_SCRIPT, len(lists), *lists, UNACKED_KEY, SCAN_CHUNK, TAIL_CHARS)
    return {item.decode() if isinstance(item, bytes) else str(item) for item in raw or ()}


def take_action(
    client: redis.Redis, action_id: str, queue: str, sep: str, steps: Sequence[int],
    stranded: Stranded,
) -> bytes | None:
    """Atomically, unless the node has heart-beaten within ``stranded.silent_s`` (it is back,
    and will run the action itself), remove ``action_id``'s message from ``queue`` (any
    priority list) or from the ``unacked`` hash and store ``stranded.answer`` as its result;
    returns the message, or None when nothing was taken. The answer is on a replica before
    this returns when Redis has one (:func:`~tangram_celery.connection.durable`)."""
    lists = [name for _, name in priority_lists(queue, sep, steps)]
    [raw] = durable(client, "result", lambda pipe: pipe.eval(
        TAKE_SCRIPT, len(lists), *lists, UNACKED_KEY, SCAN_CHUNK, TAIL_CHARS, action_id,
        UNACKED_INDEX_KEY, keys.node(stranded.node), stranded.silent_s,
        keys.action_result(action_id), stranded.answer, stranded.ttl_s))
    return raw if isinstance(raw, bytes) else None


@dataclass(frozen=True)
class Stranded:
    """What :func:`take_action` needs to answer a stranded action: its node, how long that
    node has to have been silent, the answer (JSON) and how long it is kept."""

    node: str
    silent_s: float
    answer: str
    ttl_s: int
