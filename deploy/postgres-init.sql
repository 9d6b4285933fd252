-- One PostgreSQL server, one database per service (docs/design.md, Tables).
CREATE DATABASE payments;
CREATE DATABASE rewards;
CREATE DATABASE notifications;
