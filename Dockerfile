FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY conductor_web conductor_web
COPY routing routing
COPY audit audit
COPY accounts accounts
COPY training training
COPY compliance compliance
COPY utilities utilities
ARG EXTRAS=""
RUN pip install ".${EXTRAS:+[$EXTRAS]}"
COPY . .
RUN DJANGO_SECRET_KEY=build DATABASE_URL=postgres://build@localhost/build REDIS_URL=redis://localhost \
    python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "conductor_web.asgi:application"]
