"""The rank's HTTP endpoint: the server, its pages, basic auth, the request budget and the live page's history."""
