"""Persistence: consensus in Postgres (remap collections, shards, read holds, status) and parts in a
blob store. Every function takes a psycopg connection and does its work in one transaction."""
