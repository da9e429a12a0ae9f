"""The enqueue side: a call's unique key, the row that holds it, the queue lock, early duplicates,
and the broker's enqueue wrapped around them (with ``transaction()``)."""
