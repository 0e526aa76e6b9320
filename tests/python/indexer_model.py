"""A reference model of kvpool-indexer's semantics, as docs/indexer.md defines them.

It is deliberately naive (sets and dicts, every answer recomputed from scratch) so
that it can be read against the document line by line:

- a registration is keyed by (instance_id, tenant_id, dp_rank), has a scope
  (modelname, lora_name, block_size, additionalsalt) and publishers (endpoint ->
  type); registering the same key with the same scope adds a publisher (or updates
  its type), another scope replaces the registration (its publishers and blocks go);
- a block is present for (registration, publisher, medium) while that publisher
  stored it on that medium and has not removed it, cleared it, nor been resynced;
- hashing standard: local = XXH3-64(tokens as little-endian u32, S), seq[0] =
  local[0], seq[i] = XXH3-64(le64(seq[i-1]) || le64(local[i]), S); only complete
  blocks;
- engine hash -> standard hash per scope (tenant, model, lora, block size, salt):
  learnt from stored events with token ids (hashed from the parent's standard hash),
  used for removes and for events without token ids; a stored event with tokens whose
  parent is an unmapped hash is unplaced (counted, not indexed);
- an event applies to every registration its publisher is registered for, except an
  envelope event whose tenant_id is not the registration's, and, for engines (type
  not kvpool / Mooncake), a batch with a DP rank under which the publisher is
  registered for the instance applies only to that rank's registration;
- AllBlocksCleared drops every block of the publisher for the registration; an
  envelope "cleared" only on its medium; a resync drops all the publisher's blocks;
- /query, /query_by_hash: per instance registered under the tenant in the scope,
  longest_matched, GPU / CPU / DISK (and other media held), DP per rank, rank_matches
  per rank ({gpu, cpu, disk}: the GPU -> CPU -> DISK walk, never back up a tier).
"""

import struct

import xxhash

MASK = (1 << 64) - 1
POOL_TYPES = ("kvpool", "Mooncake")
TIERS = ("GPU", "CPU", "DISK")


def local_hash(tokens, seed=0):
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(tokens)}I", *tokens), seed)


def chain(prev, local, seed=0):
    return xxhash.xxh3_64_intdigest(struct.pack("<QQ", prev, local), seed)


def seq_hashes(tokens, block_size, seed=0, parent=None):
    """The standard rolling hashes of the complete blocks of tokens, continuing from
    the standard hash `parent` (None: from the start)."""
    out = []
    prev = parent
    for i in range(len(tokens) // block_size):
        loc = local_hash(tokens[i * block_size:(i + 1) * block_size], seed)
        prev = loc if prev is None else chain(prev, loc, seed)
        out.append(prev)
    return out


def medium_name(m):
    return "GPU" if m is None else str(m).upper()


class Registration:
    def __init__(self, key, scope):
        self.key = key  # (instance, tenant, rank)
        self.scope = scope  # (model, lora, block_size, salt)
        self.publishers = {}  # endpoint -> type

    @property
    def instance(self):
        return self.key[0]

    @property
    def tenant(self):
        return self.key[1]

    @property
    def rank(self):
        return self.key[2]

    @property
    def ns(self):
        """The namespace of its hashes: (tenant, model, lora, block_size, salt)."""
        return (self.tenant,) + self.scope


class Model:
    def __init__(self, seed=0):
        self.seed = seed
        self.regs = {}  # key -> Registration
        self.held = {}  # (key, endpoint) -> {medium: set(std hashes)}
        self.maps = {}  # namespace -> {engine hash: std hash}
        self.unplaced = 0

    # ---- registrations ----

    def register(self, instance, tenant, rank, scope, endpoint, type_="vLLM"):
        key = (instance, tenant, rank)
        scope = tuple(scope)
        r = self.regs.get(key)
        if r is not None and r.scope != scope:
            self._drop_reg(key)
            r = None
        if r is None:
            r = self.regs[key] = Registration(key, scope)
        r.publishers[endpoint] = type_

    def _drop_reg(self, key):
        self.regs.pop(key, None)
        for k in [k for k in self.held if k[0] == key]:
            del self.held[k]

    def unregister(self, instance, tenant="default", rank=None):
        """The removed registrations' names ("instance|tenant|rank"), [] when none."""
        keys = [k for k in self.regs
                if k[0] == instance and k[1] == tenant and (rank is None or k[2] == rank)]
        for k in keys:
            self._drop_reg(k)
        return sorted(f"{k[0]}|{k[1]}|{k[2]}" for k in keys)

    def regs_of(self, endpoint):
        return [r for r in self.regs.values() if endpoint in r.publishers]

    # ---- events ----

    def resync(self, endpoint):
        for k in [k for k in self.held if k[1] == endpoint]:
            del self.held[k]

    def _targets(self, endpoint, dp_rank):
        out = []
        for r in self.regs_of(endpoint):
            if r.publishers[endpoint] not in POOL_TYPES and dp_rank is not None:
                narrowed = (r.instance, r.tenant, dp_rank)
                if narrowed in self.regs and endpoint in self.regs[narrowed].publishers \
                        and r.rank != dp_rank:
                    continue
            out.append(r)
        return out

    def apply_batch(self, endpoint, events, dp_rank=None):
        """Apply one decoded batch of vllm_publisher.Event."""
        for r in self._targets(endpoint, dp_rank):
            for e in events:
                if e.envelope and e.tenant_id is not None and e.tenant_id != r.tenant:
                    continue
                self._apply(r, endpoint, e)

    def _std(self, r, h):
        return self.maps.get(r.ns, {}).get(h, h)

    def _apply(self, r, endpoint, e):
        media = self.held.setdefault((r.key, endpoint), {})
        if e.kind == "cleared":
            if e.envelope:
                media.pop(medium_name(e.medium), None)
            else:
                media.clear()
            return
        m = medium_name(e.medium)
        if e.kind == "removed":
            s = media.get(m)
            if s:
                for h in e.hashes:
                    s.discard(self._std(r, h))
            return
        # stored
        if e.token_ids:
            bs = r.scope[2]
            mp = self.maps.setdefault(r.ns, {})
            if e.parent is None:
                parent = None
            elif e.parent in mp:
                parent = mp[e.parent]
            else:
                self.unplaced += len(e.hashes)
                return
            std = seq_hashes(e.token_ids, bs, self.seed, parent)
            assert len(std) == len(e.hashes), "the test sent tokens for other blocks"
            for eh, sh in zip(e.hashes, std):
                mp[eh] = sh
        else:
            std = [self._std(r, h) for h in e.hashes]
        media.setdefault(m, set()).update(std)

    # ---- queries ----

    def _present(self, key, medium=None):
        """The std hashes present for registration key (on medium, or any)."""
        out = set()
        for (k, _ep), media in self.held.items():
            if k != key:
                continue
            for m, s in media.items():
                if medium is None or m == medium:
                    out |= s
        return out

    @staticmethod
    def _run(hashes, present):
        k = 0
        for h in hashes:
            if h not in present:
                break
            k += 1
        return k

    def query_hashes(self, tenant, scope, hashes, instance=None):
        """The /query_by_hash answer for the std hashes h (the /query answer after
        hashing): {tenant: {instance: {...}}}."""
        scope = tuple(scope)
        bs = scope[2]
        hashes = [h & MASK for h in hashes]
        insts = {}
        for r in self.regs.values():
            if r.tenant == tenant and r.scope == scope and \
                    (instance is None or r.instance == instance):
                insts.setdefault(r.instance, []).append(r)
        ans = {}
        for inst, regs in insts.items():
            per_rank = {r.rank: {} for r in regs}  # rank -> medium -> set
            for r in regs:
                for (k, _ep), media in self.held.items():
                    if k == r.key:
                        for m, s in media.items():
                            per_rank[r.rank].setdefault(m, set()).update(s)
            media_all = {}
            for pm in per_rank.values():
                for m, s in pm.items():
                    media_all.setdefault(m, set()).update(s)
            anyp = set().union(*media_all.values()) if media_all else set()
            a = {"longest_matched": bs * self._run(hashes, anyp)}
            for m in set(TIERS) | {m for m, s in media_all.items() if s}:
                a[m] = bs * self._run(hashes, media_all.get(m, set()))
            a["DP"] = {}
            a["rank_matches"] = {}
            for rank, pm in per_rank.items():
                allr = set().union(*pm.values()) if pm else set()
                a["DP"][str(rank)] = bs * self._run(hashes, allr)
                counts = [0, 0, 0]
                cur = 0
                for h in hashes:
                    t = next((t for t in range(cur, 3) if h in pm.get(TIERS[t], ())), None)
                    if t is None:
                        break
                    counts[t] += 1
                    cur = t
                a["rank_matches"][str(rank)] = {
                    "gpu": bs * counts[0], "cpu": bs * (counts[0] + counts[1]),
                    "disk": bs * sum(counts)}
            ans[inst] = a
        return {tenant: ans}

    def query(self, tenant, scope, token_ids, instance=None):
        return self.query_hashes(tenant, scope, seq_hashes(token_ids, scope[2], self.seed),
                                 instance)

    # ---- introspection ----

    def block_count(self, key):
        return len(self._present(key))
