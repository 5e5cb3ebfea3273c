"""The long-context benchmark: a real model and a 3,000-token real-text prompt through a
ladder to 8K, ovspec's paged path against genai's default backend and llama.cpp."""
