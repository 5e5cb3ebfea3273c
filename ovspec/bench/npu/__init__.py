"""The NPU-plugin benchmark (issue 27): genai's static NPU pipeline against ovspec's
ladder on the NPU plugin's NPUW, compiling for CPU subdevices, from ``speed``'s arms."""
