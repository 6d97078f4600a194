# The operator image (built outside this repo's CI, which has no container engine).
FROM python:3.11-slim
RUN useradd --uid 10001 --create-home loadline
WORKDIR /app
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip install --no-cache-dir . && rm -rf /root/.cache
USER 10001
ENTRYPOINT ["loadline"]
CMD ["run"]
