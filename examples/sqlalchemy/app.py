"""brooq with SQLAlchemy 2: a Session writes a row and enqueues a job in one transaction.

    DATABASE_URL=postgresql://app@localhost/app python examples/sqlalchemy/app.py

The engine must use the psycopg 3 dialect (``postgresql+psycopg://``): brooq.enqueue runs
its INSERT on the Session's own psycopg connection, so the job commits with the row, or
neither does. ``create_schema`` makes the example's table; brooq's own schema comes from
``brooq migrate up`` (or ``brooq migrate sql`` pasted into an Alembic revision).
"""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import URL, Engine, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import brooq


class Base(DeclarativeBase):
    pass


class Signup(Base):
    __tablename__ = "example_signup"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))


def engine_for(dsn: str) -> Engine:
    """A SQLAlchemy engine on psycopg 3 for a DSN as brooq takes it (a postgresql:// URL
    or key=value pairs)."""
    params = conninfo_to_dict(dsn)
    url = URL.create(
        "postgresql+psycopg",
        username=params.pop("user", None),
        password=params.pop("password", None),
        host=params.pop("host", None),
        port=int(params.pop("port")) if "port" in params else None,
        database=params.pop("dbname", None),
        query={k: str(v) for k, v in params.items()},
    )
    return create_engine(url)


def create_schema(engine: Engine) -> None:
    Base.metadata.create_all(engine)


def sign_up(session: Session, email: str, *, fail: bool = False) -> int:
    """The row and its welcome e-mail job in one transaction: commit both or neither."""
    with session.begin():  # commits at the end of the block, rolls back on an exception
        signup = Signup(email=email)
        session.add(signup)
        session.flush()  # the INSERT runs now, so signup.id is known
        brooq.enqueue(session, brooq.Job("email.welcome", {"signup": signup.id}))
        if fail:
            raise RuntimeError("something went wrong after the enqueue")
    return signup.id


if __name__ == "__main__":
    engine = engine_for(os.environ["DATABASE_URL"])
    create_schema(engine)
    with Session(engine) as session:
        print("signup", sign_up(session, "ann@example.org"), "and its job committed")
