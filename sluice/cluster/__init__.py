"""sluice replicas on Ray Serve (``sluice serve --ray``; needs the ``cluster`` extra).

A replica is one whole sluice runtime behind sluice's own HTTP app (``replica``); a front
end (``ingress``) reads each request, fingerprints its prompt prefix and routes it through
Serve's request-router interface with sluice's pure replica policies (``router``, over
``sluice.policy.queues.replica_router``); replicas scale on sluice's own load signal
(``autoscale``, over ``sluice.policy.capacity.autoscale``); ``app`` builds the Serve application
from the ``[cluster]`` section of the usual config file. ``asgi`` and ``hints`` need no Ray.
"""
