"""Stop strings as one automaton per stop set (Aho-Corasick): each character of the output costs one
transition, however many stop strings a request has and however long they are.

    auto = stop_automaton(("</answer>", "\\n\\n"))
    state, end, length = auto.feed(0, text)   # end: index in `text` where the first stop string ends (-1: none)
    auto.depth[state]                         # how much of the text so far could still become a stop string

A stop string matches where it first ends in the output (the text as if it came one character at a time,
whatever the token boundaries); of the stop strings that end there, the longest.
"""
from functools import lru_cache


class StopAutomaton:
    __slots__ = ("goto", "fail", "depth", "out")

    def __init__(self, stops):
        goto, depth, terminal = [{}], [0], [0]
        for s in stops:
            node = 0
            for c in s:
                nxt = goto[node].get(c)
                if nxt is None:
                    nxt = goto[node][c] = len(goto)
                    goto.append({})
                    depth.append(depth[node] + 1)
                    terminal.append(0)
                node = nxt
            terminal[node] = len(s)
        fail, out = [0] * len(goto), list(terminal)
        queue = list(goto[0].values())
        for node in queue:                      # breadth first: a node's fail link is shallower than it
            for c, child in goto[node].items():
                f = fail[node]
                while f and c not in goto[f]:
                    f = fail[f]
                fail[child] = goto[f].get(c, 0)
                if not out[child]:              # the longest stop string ending here: its own, else its suffix's
                    out[child] = out[fail[child]]
                queue.append(child)
        self.goto, self.fail, self.depth, self.out = goto, fail, depth, out

    def feed(self, state, text):
        """Run `text` from `state`: (state after it, index where the first stop string ends or -1, its length).
        On a match the state is of no further use (the stream ends)."""
        goto, fail, out = self.goto, self.fail, self.out
        for i, c in enumerate(text):
            nxt = goto[state].get(c)
            while nxt is None and state:
                state = fail[state]
                nxt = goto[state].get(c)
            state = nxt or 0
            if out[state]:
                return state, i, out[state]
        return state, -1, 0


@lru_cache(maxsize=256)
def stop_automaton(stops):
    """The automaton of a tuple of non-empty stop strings (shared by the requests and choices that send the
    same set)."""
    return StopAutomaton(stops)
