"""Draft KV sliding window for vLLM Model Runner V2 speculators.

With ``additional_config={"draft_window_size": W}`` the draft model attends only to the
last W tokens of each request (start aligned down to a block), while the target keeps full
attention and the draft's KV writes stay at absolute positions.
"""
